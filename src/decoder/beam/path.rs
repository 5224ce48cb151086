//! A hypothesis' tokens as a shared, persistent list: a fork shares its parent's tokens and
//! adds its own at the head, so extending a beam copies nothing, and tokens no live
//! hypothesis leads to are freed as soon as the last one that did is dropped.

use crate::tokenizer::Token;
use std::rc::Rc;

struct Link {
    token: Token,
    prev: Option<Rc<Link>>,
}

impl Drop for Link {
    /// Unlinks the chain iteratively: the default recursive drop of an hour-long transcript
    /// would overflow the stack.
    fn drop(&mut self) {
        let mut next = self.prev.take();
        while let Some(link) = next {
            match Rc::try_unwrap(link) {
                Ok(mut only) => next = only.prev.take(),
                Err(_) => break,
            }
        }
    }
}

/// The tokens of one hypothesis, newest at the head.
#[derive(Clone, Default)]
pub(super) struct TokenPath {
    head: Option<Rc<Link>>,
    len: usize,
}

impl TokenPath {
    /// This path with `token` appended.
    pub(super) fn push(&self, token: Token) -> TokenPath {
        TokenPath {
            head: Some(Rc::new(Link {
                token,
                prev: self.head.clone(),
            })),
            len: self.len + 1,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The tokens, oldest first.
    pub(super) fn to_vec(&self) -> Vec<Token> {
        let mut out = Vec::with_capacity(self.len);
        let mut at = self.head.as_deref();
        while let Some(link) = at {
            out.push(link.token.clone());
            at = link.prev.as_deref();
        }
        out.reverse();
        out
    }

    /// The ids of the last `n` tokens, oldest first, and the path before them.
    pub(super) fn split_tail(&self, n: usize) -> (TokenPath, Vec<usize>) {
        let mut ids = Vec::with_capacity(n);
        let mut at = self.head.clone();
        for _ in 0..n.min(self.len) {
            let Some(link) = at else { break };
            ids.push(link.token.id);
            at = link.prev.clone();
        }
        ids.reverse();
        let len = self.len - ids.len();
        (TokenPath { head: at, len }, ids)
    }

    /// Whether both paths hold the same token ids (frames and durations aside).
    pub(super) fn same_ids(&self, other: &TokenPath) -> bool {
        if self.len != other.len {
            return false;
        }
        let (mut a, mut b) = (self.head.as_deref(), other.head.as_deref());
        while let (Some(x), Some(y)) = (a, b) {
            if std::ptr::eq(x, y) {
                return true;
            }
            if x.token.id != y.token.id {
                return false;
            }
            (a, b) = (x.prev.as_deref(), y.prev.as_deref());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: usize) -> Token {
        Token {
            id,
            frame: id,
            duration: 0,
        }
    }

    #[test]
    fn forks_share_and_keep_order() {
        let root = TokenPath::default().push(token(1));
        let a = root.push(token(2));
        let b = root.push(token(3));
        assert_eq!(a.to_vec().iter().map(|t| t.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(b.to_vec().iter().map(|t| t.id).collect::<Vec<_>>(), [1, 3]);
        assert!(!a.same_ids(&b));
        assert!(a.same_ids(&root.push(token(2))));
        assert_eq!(a.len(), 2);
        let (before, tail) = a.split_tail(1);
        assert_eq!(tail, [2]);
        assert!(before.same_ids(&root));
    }

    #[test]
    fn a_long_path_drops_without_recursion() {
        let mut path = TokenPath::default();
        for i in 0..1_000_000 {
            path = path.push(token(i % 7));
        }
        drop(path);
    }
}
