//! Who may use the server: an API key that every API route and the realtime socket require
//! (`Authorization: Bearer KEY`, as OpenAI's clients send it; a browser's WebSocket, which
//! cannot set headers, names it in a subprotocol as OpenAI's realtime accepts it), and the
//! origins a browser may call it from (the page's own, and those `--allow-origin` names).
//!
//! The page's static files and `/health` need no key: they hold nothing of the API (without
//! the key, `/health` says only that the server is up).

use super::openai::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The subprotocol a browser's WebSocket names its key in (`openai-insecure-api-key.KEY`), as
/// OpenAI's realtime takes it.
pub const KEY_SUBPROTOCOL: &str = "openai-insecure-api-key.";

/// The subprotocol the realtime socket answers with (a browser that offers subprotocols fails
/// the handshake unless the server picks one of them).
pub const REALTIME_SUBPROTOCOL: &str = "realtime";

/// The longest API key accepted (a header line, and a subprotocol token, must carry it).
const MAX_KEY_BYTES: usize = 4096;

/// The server's key and the origins allowed besides the page's own.
#[derive(Clone, Debug, Default)]
pub struct Access {
    key: Option<Vec<u8>>,
    origins: Vec<String>,
    /// Paths anyone may read (the page and its files).
    public: Vec<&'static str>,
}

impl Access {
    /// `key` (checked with [`check_key`]), the `--allow-origin` values (each checked with
    /// [`check_origin`]), and the paths that need no key.
    pub fn new(
        key: Option<String>,
        origins: &[String],
        public: Vec<&'static str>,
    ) -> Result<Access, String> {
        let key = key
            .map(|k| check_key(&k).map(|()| k.into_bytes()))
            .transpose()?;
        let origins = origins
            .iter()
            .map(|o| check_origin(o))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Access {
            key,
            origins,
            public,
        })
    }

    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// Whether the request carries the key (always, when the server has none).
    pub fn authorized(&self, headers: &HeaderMap, socket: bool) -> Result<(), KeyProblem> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let given = match bearer(headers)? {
            Some(k) => Some(k),
            // A browser's WebSocket cannot set headers: its key comes as a subprotocol.
            None if socket => subprotocol_key(headers),
            None => None,
        };
        match given {
            None => Err(KeyProblem::Missing),
            Some(k) if keys_match(k.as_bytes(), key) => Ok(()),
            Some(_) => Err(KeyProblem::Wrong),
        }
    }

    /// Whether a request from `origin` may be answered: the page's own origin (the request's
    /// `Host`), or one `--allow-origin` named.
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        same_origin(origin, host) || self.origins.iter().any(|o| o == origin)
    }

    /// Whether a cross-origin `origin` is allowed by name (its responses carry CORS headers).
    fn listed(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == origin)
    }
}

/// Why a request is refused for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyProblem {
    Missing,
    Wrong,
    /// An `Authorization` header that is not `Bearer <key>`.
    Malformed,
}

impl KeyProblem {
    /// The refusal, in OpenAI's shape (401, `invalid_request_error`).
    pub fn error(self) -> ApiError {
        let (message, code) = match self {
            KeyProblem::Missing => (
                "You didn't provide an API key: this server requires one (--api-key). Send it in an Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY); a browser's WebSocket may name it as the subprotocol openai-insecure-api-key.YOUR_KEY.",
                None,
            ),
            KeyProblem::Wrong => (
                "Incorrect API key provided: it is not this server's key (--api-key).",
                Some("invalid_api_key"),
            ),
            KeyProblem::Malformed => (
                "The Authorization header is not Bearer auth: send the API key as Authorization: Bearer YOUR_KEY.",
                Some("invalid_api_key"),
            ),
        };
        ApiError::new(StatusCode::UNAUTHORIZED, message, None, code)
    }
}

/// A key must fit a header and a WebSocket subprotocol token: printable ASCII without spaces
/// or separators, 1 to 4096 bytes.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the API key is empty".into());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the API key is {} bytes long, more than the {MAX_KEY_BYTES} a header may carry",
            key.len()
        ));
    }
    if let Some(c) = key.chars().find(|&c| !is_token_char(c)) {
        return Err(format!(
            "the API key holds {c:?}: a key may hold letters, digits and !#$%&'*+-.^_`|~ only (it travels in a header and a WebSocket subprotocol)"
        ));
    }
    Ok(())
}

/// RFC 9110's `tchar`: what a subprotocol token (and so a browser's key) may hold.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// An `--allow-origin` value: `scheme://host[:port]`, as a browser sends `Origin`.
pub fn check_origin(origin: &str) -> Result<String, String> {
    let o = origin.trim().trim_end_matches('/');
    let ok = ["http://", "https://"].iter().any(|s| {
        o.strip_prefix(s)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ', '*']))
    });
    if ok {
        Ok(o.to_string())
    } else {
        Err(format!(
            "--allow-origin {origin:?} is not an origin: expected scheme://host[:port], such as https://app.example.com"
        ))
    }
}

/// The key of an `Authorization: Bearer KEY` header (`None` without the header; the scheme's
/// case does not matter).
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, KeyProblem> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| KeyProblem::Malformed)?.trim();
    let (scheme, key) = value.split_once(' ').ok_or(KeyProblem::Malformed)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(KeyProblem::Malformed);
    }
    Ok(Some(key))
}

/// The key a WebSocket handshake names as a subprotocol (`openai-insecure-api-key.KEY`, among
/// the comma-separated `Sec-WebSocket-Protocol` values).
pub fn subprotocol_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(KEY_SUBPROTOCOL))
        .filter(|k| !k.is_empty())
}

/// Whether `given` equals `expected`, in a time that depends on `expected`'s length alone:
/// every byte is compared whatever the first difference, so the time a guess takes says
/// nothing of how much of it was right.
pub fn keys_match(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        // A shorter guess is compared against zeros (its length already differs).
        let g = given.get(i).copied().unwrap_or(0);
        diff |= g ^ e;
    }
    // Keeps the compiler from ending the loop at the first difference.
    std::hint::black_box(diff) == 0
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent to.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
}

/// The headers a request may carry across origins (and the preflight allows).
const ALLOWED_HEADERS: &str = "authorization, content-type, openai-beta, x-stainless-lang";

/// The guard in front of every route: refuses requests from origins not allowed, answers the
/// preflights of those allowed, and requires the key on every path but the public ones.
pub async fn guard(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let headers = req.headers();
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let cross = match &origin {
        None => None,
        Some(o) if same_origin(o, host.as_deref()) => None,
        Some(o) if access.listed(o) => Some(o.clone()),
        Some(o) => {
            eprintln!(
                "refused {} {path}: cross-origin request from {o}",
                req.method()
            );
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "cross-origin requests from {o} are refused: start the server with --allow-origin {o} to allow them"
                ),
                None,
                Some("origin_not_allowed"),
            )
            .into_response();
        }
    };
    if req.method() == Method::OPTIONS
        && let Some(o) = &cross
    {
        // A preflight carries no key: it only asks what the real request may send.
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        cors_headers(h, o);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOWED_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        return resp;
    }
    let public = access.public.contains(&path.as_str());
    let socket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let authorized = access.authorized(headers, socket);
    let mut resp = match authorized {
        Ok(()) => next.run(req).await,
        // Without the key, the health check says only that the server is up.
        Err(_) if path == "/health" => {
            axum::Json(serde_json::json!({"status": "ok"})).into_response()
        }
        Err(_) if public => next.run(req).await,
        Err(problem) => {
            eprintln!("refused {} {path}: 401 ({problem:?} API key)", req.method());
            let mut resp = problem.error().into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
    };
    if let Some(o) = &cross {
        cors_headers(resp.headers_mut(), o);
    }
    resp
}

/// What an allowed cross-origin response carries.
fn cors_headers(h: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("x-request-id, x-worker-ms, retry-after"),
    );
}

/// Whether the server is reachable from other machines at `ip`: anything but loopback.
pub fn exposed(ip: std::net::IpAddr) -> bool {
    !ip.is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(&headers(&[])), Ok(None));
        let h = headers(&[("authorization", "Bearer sk-1")]);
        assert_eq!(bearer(&h), Ok(Some("sk-1")));
        let h = headers(&[("authorization", "bearer   sk-1 ")]);
        assert_eq!(bearer(&h), Ok(Some("sk-1")));
        for bad in ["Basic abc", "Bearer", "Bearer ", "sk-1"] {
            let h = headers(&[("authorization", bad)]);
            assert_eq!(bearer(&h), Err(KeyProblem::Malformed), "{bad}");
        }
    }

    #[test]
    fn subprotocol_keys() {
        let h = headers(&[(
            "sec-websocket-protocol",
            "realtime, openai-insecure-api-key.sk-9, openai-beta.realtime-v1",
        )]);
        assert_eq!(subprotocol_key(&h), Some("sk-9"));
        let h = headers(&[(
            "sec-websocket-protocol",
            "realtime, openai-insecure-api-key.",
        )]);
        assert_eq!(subprotocol_key(&h), None);
    }

    #[test]
    fn keys_compare_whole() {
        assert!(keys_match(b"secret", b"secret"));
        assert!(!keys_match(b"secreT", b"secret"));
        assert!(!keys_match(b"secre", b"secret"));
        assert!(!keys_match(b"secret\0", b"secret"));
        assert!(!keys_match(b"", b"secret"));
    }

    #[test]
    fn keys_and_origins_are_checked() {
        assert!(check_key("sk-abc_123.x").is_ok());
        assert!(check_key("").unwrap_err().contains("empty"));
        assert!(check_key("a b").unwrap_err().contains("' '"));
        assert!(check_key("ключ").is_err());
        assert_eq!(
            check_origin("https://app.example.com/").unwrap(),
            "https://app.example.com"
        );
        assert!(check_origin("app.example.com").is_err());
        assert!(check_origin("*").is_err());
        assert!(check_origin("https://a.com/path").is_err());
    }

    #[test]
    fn same_origin_is_the_host_asked() {
        assert!(same_origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://evil.test", Some("127.0.0.1:8080")));
        assert!(!same_origin("http://127.0.0.1:8080", None));
        assert!(!same_origin("null", Some("127.0.0.1:8080")));
    }
}
