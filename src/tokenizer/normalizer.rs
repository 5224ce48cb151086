//! SentencePiece's text normaliser: the rule table a model was trained with (its
//! `precompiled_charsmap`, e.g. `nmt_nfkc`), applied longest match first, then its whitespace
//! settings. Text must be normalised exactly as SentencePiece does before segmentation, or the
//! ids differ from NeMo's.

/// SentencePiece's word-boundary marker, which stands for a space in normalised text.
pub const SPACE_SYMBOL: &str = "\u{2581}";

/// A model's `NormalizerSpec`.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalizer {
    /// The rule set's name (`nmt_nfkc`, `identity`, ...): informational, the rules are in
    /// `charsmap`.
    pub name: String,
    /// The compiled rules: a u32 byte count, a double-array trie of that many bytes mapping
    /// source byte strings to offsets, then the NUL-terminated replacement strings. Empty: no
    /// rules (identity).
    pub charsmap: Vec<u8>,
    /// Prepend a space, so a text's first word looks like every other word.
    pub add_dummy_prefix: bool,
    /// Drop leading and trailing spaces and collapse runs of them.
    pub remove_extra_whitespaces: bool,
    /// Write spaces as [`SPACE_SYMBOL`].
    pub escape_whitespaces: bool,
}

impl Normalizer {
    /// `input` normalised. `protected` gives the length of a user-defined piece at the start
    /// of a text (0 if none): those pieces pass through unnormalised.
    pub fn normalize(&self, input: &str, protected: impl Fn(&str) -> usize) -> String {
        let rules = Rules::new(&self.charsmap);
        let space: &[u8] = if self.escape_whitespaces {
            SPACE_SYMBOL.as_bytes()
        } else {
            b" "
        };
        let prefix = |rest: &str| -> (Vec<u8>, usize) {
            let n = protected(rest);
            if n > 0 {
                return (rest.as_bytes()[..n].to_vec(), n);
            }
            match rules.longest_match(rest.as_bytes()) {
                Some((replacement, n)) => (replacement.to_vec(), n),
                None => {
                    let n = rest.chars().next().map_or(0, char::len_utf8);
                    (rest.as_bytes()[..n].to_vec(), n)
                }
            }
        };
        let mut rest = input;
        if self.remove_extra_whitespaces {
            while !rest.is_empty() {
                let (piece, n) = prefix(rest);
                if piece != b" " {
                    break;
                }
                rest = &rest[n..];
            }
        }
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 3 / 2 + 3);
        if rest.is_empty() {
            return String::new();
        }
        if self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut previous_was_space = self.remove_extra_whitespaces;
        while !rest.is_empty() {
            let (piece, n) = prefix(rest);
            let mut piece = &piece[..];
            if previous_was_space {
                while let Some(tail) = piece.strip_prefix(b" ") {
                    piece = tail;
                }
            }
            if !piece.is_empty() {
                for &b in piece {
                    if b == b' ' {
                        out.extend_from_slice(space);
                    } else {
                        out.push(b);
                    }
                }
                previous_was_space = piece.ends_with(b" ");
            }
            // A rule may end in the middle of a character only if the table is corrupt; then
            // the text from there on is lost rather than split inside a character.
            rest = rest.get(n..).unwrap_or_default();
            if !self.remove_extra_whitespaces {
                previous_was_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Normalizer {
    /// Checks the rule table's structure, so that a damaged one is refused when the model is
    /// loaded instead of silently normalising text wrongly: the header's trie size fits the
    /// table and is whole units; the replacement strings are NUL-terminated UTF-8; every value
    /// unit (a rule's end) addresses the start of one of them; every other unit's children lie
    /// inside the trie; and there is at least one rule. One pass over the units (the trie is a
    /// DAWG whose paths share suffixes: walking every key would cost far more). Says what is
    /// wrong.
    pub fn check_charsmap(&self) -> Result<(), String> {
        let table = &self.charsmap;
        if table.is_empty() {
            return Ok(());
        }
        let Some(header) = table.get(..4) else {
            return Err(format!(
                "{} bytes, shorter than its 4-byte header",
                table.len()
            ));
        };
        let size = u32::from_le_bytes(header.try_into().expect("4 bytes")) as usize;
        let held = table.len() - 4;
        if size > held {
            return Err(format!(
                "its header gives a {size}-byte trie, but the table holds {held} bytes"
            ));
        }
        if size == 0 || !size.is_multiple_of(4) {
            return Err(format!(
                "its trie of {size} bytes is not a whole number of 4-byte units"
            ));
        }
        let rules = Rules::new(table);
        let strings = rules.replacements;
        if strings.last() != Some(&0) {
            return Err("its replacement strings do not end with a NUL".into());
        }
        for (i, s) in strings[..strings.len() - 1].split(|&b| b == 0).enumerate() {
            if std::str::from_utf8(s).is_err() {
                return Err(format!(
                    "its replacement string {} is not UTF-8 text",
                    i + 1
                ));
            }
        }
        let units = size / 4;
        let mut values = 0usize;
        for index in 0..units {
            let unit = rules.unit(index).expect("a unit inside the trie");
            if unit >> 31 == 1 {
                let value = (unit & ((1 << 31) - 1)) as usize;
                if value >= strings.len() || (value > 0 && strings[value - 1] != 0) {
                    return Err(format!(
                        "unit {index} points to byte {value} of the {}-byte replacement \
                         strings, not to the start of one",
                        strings.len()
                    ));
                }
                values += 1;
            } else if index ^ offset(unit) >= units {
                return Err(format!(
                    "unit {index} points outside the trie of {units} units"
                ));
            }
        }
        if values == 0 {
            return Err("its trie holds no rule".into());
        }
        Ok(())
    }
}

/// Where a unit's children start, relative to it (darts-clone's unit format: bits 10.., shifted
/// by 8 more when bit 9 is set).
fn offset(unit: u32) -> usize {
    ((unit >> 10) << ((unit & (1 << 9)) >> 6)) as usize
}

/// A view of a compiled rule table.
struct Rules<'a> {
    /// The trie's units (little-endian u32).
    trie: &'a [u8],
    /// NUL-terminated replacement strings, addressed by the trie's values.
    replacements: &'a [u8],
}

impl<'a> Rules<'a> {
    fn new(charsmap: &'a [u8]) -> Rules<'a> {
        let empty = Rules {
            trie: &[],
            replacements: &[],
        };
        let Some(size) = charsmap.get(..4) else {
            return empty;
        };
        let size = u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize;
        match charsmap.get(4..).filter(|rest| size <= rest.len()) {
            Some(rest) => Rules {
                trie: &rest[..size - size % 4],
                replacements: &rest[size..],
            },
            None => empty,
        }
    }

    fn unit(&self, index: usize) -> Option<u32> {
        let bytes = self.trie.get(index * 4..index * 4 + 4)?;
        Some(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    /// The replacement of the longest rule matching the start of `text`, and the bytes it
    /// replaces. The trie is a double array (darts-clone's unit format): a unit's low byte is
    /// its label, bit 8 says a rule ends here, bits 10.. (shifted by 8 more if bit 9 is set)
    /// give the offset to its children; a leaf unit's low 31 bits are the value.
    fn longest_match(&self, text: &[u8]) -> Option<(&'a [u8], usize)> {
        let mut node = offset(self.unit(0)?);
        let mut best = None;
        for (i, &byte) in text.iter().enumerate() {
            node ^= byte as usize;
            let unit = self.unit(node)?;
            if unit & ((1 << 31) | 0xff) != byte as u32 {
                break;
            }
            node ^= offset(unit);
            if (unit >> 8) & 1 == 1 {
                let value = (self.unit(node)? & ((1 << 31) - 1)) as usize;
                best = Some((value, i + 1));
            }
        }
        let (value, length) = best?;
        let tail = self.replacements.get(value..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        Some((&tail[..end], length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(add_dummy_prefix: bool, remove_extra_whitespaces: bool) -> Normalizer {
        Normalizer {
            name: "identity".into(),
            charsmap: Vec::new(),
            add_dummy_prefix,
            remove_extra_whitespaces,
            escape_whitespaces: true,
        }
    }

    #[test]
    fn whitespace_settings() {
        let none = |_: &str| 0;
        assert_eq!(identity(true, true).normalize("  a  b ", none), "▁a▁b");
        assert_eq!(identity(true, false).normalize(" a  b", none), "▁▁a▁▁b");
        assert_eq!(identity(false, true).normalize("a b", none), "a▁b");
        assert_eq!(identity(true, true).normalize("   ", none), "");
        assert_eq!(identity(true, false).normalize("", none), "");
    }

    #[test]
    fn a_corrupt_table_matches_nothing() {
        let mut n = identity(true, false);
        n.charsmap = vec![200, 0, 0, 0, 1, 2];
        assert_eq!(n.normalize("ab", |_| 0), "▁ab");
    }
}
