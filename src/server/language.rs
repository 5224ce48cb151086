//! The `language` of a `verbose_json` response. OpenAI names the audio's language in English,
//! lower case ("english"), and its clients require the field. Nothing here detects a language:
//! the request's `language` (an ISO-639-1 code, a hint as in OpenAI's API) is reported when
//! given; otherwise the model's, when its vocabulary tells it (no letter beyond ASCII's: an
//! English model); otherwise "unknown" (a multilingual model transcribes what it hears).

use crate::tokenizer::Tokenizer;

/// The languages Parakeet checkpoints transcribe: English, the European languages of the
/// multilingual models, and Japanese; by ISO-639-1 code, with the name OpenAI reports.
const LANGUAGES: [(&str, &str); 26] = [
    ("bg", "bulgarian"),
    ("cs", "czech"),
    ("da", "danish"),
    ("de", "german"),
    ("el", "greek"),
    ("en", "english"),
    ("es", "spanish"),
    ("et", "estonian"),
    ("fi", "finnish"),
    ("fr", "french"),
    ("hr", "croatian"),
    ("hu", "hungarian"),
    ("it", "italian"),
    ("ja", "japanese"),
    ("lt", "lithuanian"),
    ("lv", "latvian"),
    ("mt", "maltese"),
    ("nl", "dutch"),
    ("pl", "polish"),
    ("pt", "portuguese"),
    ("ro", "romanian"),
    ("ru", "russian"),
    ("sk", "slovak"),
    ("sl", "slovenian"),
    ("sv", "swedish"),
    ("uk", "ukrainian"),
];

/// The name of the language a request's `language` field gives, or why it is refused.
pub fn requested(code: &str) -> Result<&'static str, String> {
    let code = code.trim();
    LANGUAGES
        .iter()
        .find(|(c, _)| c.eq_ignore_ascii_case(code))
        .map(|&(_, name)| name)
        .ok_or_else(|| {
            let codes: Vec<&str> = LANGUAGES.iter().map(|(c, _)| *c).collect();
            format!(
                "language {code:?}: expected an ISO-639-1 code of a language Parakeet models transcribe ({})",
                codes.join(", ")
            )
        })
}

/// The model's language when its vocabulary tells it: "english" when no piece holds a letter
/// beyond ASCII's (the multilingual and Japanese models' pieces do), else "unknown".
pub fn of_model(tokenizer: &Tokenizer) -> &'static str {
    let english = tokenizer
        .pieces()
        .iter()
        .all(|p| p.chars().all(|c| c.is_ascii() || !c.is_alphabetic()));
    if english { "english" } else { "unknown" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_as_openai_names_them() {
        assert_eq!(requested("en"), Ok("english"));
        assert_eq!(requested(" DE "), Ok("german"));
        let err = requested("english").unwrap_err();
        assert!(err.starts_with("language \"english\": expected an ISO-639-1 code"));
        assert!(err.contains("en, es"), "{err}");
        assert!(requested("").is_err());
    }

    #[test]
    fn a_vocabulary_with_letters_beyond_ascii_is_not_called_english() {
        let pieces = |p: &[&str]| Tokenizer::new(p.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            of_model(&pieces(&["<unk>", "\u{2581}the", "'s", "\u{2019}"])),
            "english"
        );
        assert_eq!(
            of_model(&pieces(&["\u{2581}the", "\u{2581}f\u{fc}r"])),
            "unknown"
        );
        assert_eq!(of_model(&pieces(&["\u{2581}the", "\u{65e5}"])), "unknown");
    }
}
