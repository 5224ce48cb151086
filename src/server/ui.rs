//! The page `GET /` serves: one HTML file, its stylesheet and scripts, built into the binary
//! (our own, with no framework and nothing loaded from elsewhere, so it works offline), and
//! `GET /ui/info`, what the page shows of the server (behind the API key, as every API route).
//! The page talks to the server through the public API alone: `POST /v1/audio/transcriptions`
//! for a file, the realtime WebSocket for the microphone; it can do nothing a client could not.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;
use std::sync::Arc;

/// The page's files: path, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("../../assets/ui/index.html"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/ui/app.css"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/ui/app.js"),
    ),
    (
        "/ui/capture.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/ui/capture.js"),
    ),
    (
        "/ui/icon.svg",
        "image/svg+xml",
        include_bytes!("../../assets/ui/icon.svg"),
    ),
];

/// What the page may load and connect to: its own files and its own server, nothing else
/// (no inline script, no other origin); the microphone for itself alone; never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
media-src 'self' blob:; connect-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// The paths that need no API key: the page's files (they hold nothing of the API).
pub fn public_paths() -> Vec<&'static str> {
    ASSETS.iter().map(|(path, _, _)| *path).collect()
}

/// The router serving the page's files and `GET /ui/info` (the JSON `info`).
pub fn router(info: Value) -> Router {
    let mut router = Router::new();
    for &(path, mime, body) in ASSETS {
        router = router.route(path, get(move || async move { asset(mime, body) }));
    }
    let info = Arc::new(info);
    router.route(
        "/ui/info",
        get(move || {
            let info = info.clone();
            async move { axum::Json(info.as_ref().clone()) }
        }),
    )
}

fn asset(mime: &'static str, body: &'static [u8]) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "permissions-policy",
        HeaderValue::from_static("microphone=(self), camera=(), geolocation=()"),
    );
    // The files change with the binary: a browser asks again rather than keep an old page.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The device the model runs on, as the page shows it.
pub fn device() -> String {
    match crate::kernels::cpu::brand() {
        Some(brand) => format!("CPU ({brand})"),
        None => "CPU".to_string(),
    }
}
