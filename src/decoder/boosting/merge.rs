//! A request's phrases merged into a server's built tree, at a cost that grows with the
//! request's phrases and the states they change, not with the server's tree: the tree's flat
//! arrays are copied (a memcpy) and patched where NeMo's rules would make the whole tree built
//! from every phrase differ. The states are numbered otherwise (the new ones come last, a
//! state gaining arcs has its arc list rewritten at the end of the arcs), but the automaton is
//! the one [`BoostingTree::new`] builds from all the phrases: from every label sequence the
//! same bonuses, bit for bit, and the same trie node.

use super::{
    BoostArc, BoostState, BoostingConfig, BoostingTree, ContextGraph, Nodes, PhraseTrie, TrieNode,
    widen,
};
use crate::error::Result;
use crate::tokenizer::Tokenizer;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A server's phrases as a built tree that each request's own phrases are merged into
/// ([`BaseTree::merge`]) without building it again.
pub struct BaseTree {
    /// The tokenised phrases with their fail arcs.
    trie: PhraseTrie,
    tree: Arc<BoostingTree>,
    /// The state of each trie node.
    state_of: Vec<u32>,
    failed_by: FailIndex,
}

/// The inverse of the fail arcs: the nodes whose fail arc points to a node, by their last
/// token (a node whose longest suffix becomes a request's new node ends with its token).
struct FailIndex {
    /// Node ids sorted by (fail, token, id).
    ids: Vec<u32>,
    /// Node `n`'s entries are `ids[start[n]..start[n + 1]]`.
    start: Vec<u32>,
}

impl FailIndex {
    fn new(graph: &ContextGraph) -> FailIndex {
        let nodes = &graph.nodes;
        let mut ids: Vec<u32> = (1..nodes.len() as u32).collect();
        ids.sort_unstable_by_key(|&id| {
            let n = &nodes[id as usize];
            (n.fail, n.token, id)
        });
        let mut start = vec![0u32; nodes.len() + 1];
        for &id in &ids {
            start[nodes[id as usize].fail as usize + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        FailIndex { ids, start }
    }

    /// The nodes whose fail arc points to `node`.
    fn failing_to(&self, node: u32) -> &[u32] {
        let n = node as usize;
        &self.ids[self.start[n] as usize..self.start[n + 1] as usize]
    }

    /// Those of them whose last token is `token`.
    fn failing_to_with(&self, graph: &ContextGraph, node: u32, token: u32) -> &[u32] {
        let all = self.failing_to(node);
        let token_of = |id: &u32| graph.nodes[*id as usize].token;
        let from = all.partition_point(|id| token_of(id) < token);
        let to = all.partition_point(|id| token_of(id) <= token);
        &all[from..to]
    }
}

/// A request's trie: the server's nodes, read through copies of those the request changes,
/// and the request's new nodes after them (ids from the server's node count on).
struct Overlay<'b> {
    base: &'b ContextGraph,
    changed: HashMap<u32, TrieNode>,
    added: Vec<TrieNode>,
    child: HashMap<(u32, u32), u32>,
}

impl Overlay<'_> {
    fn is_base(&self, id: u32) -> bool {
        (id as usize) < self.base.nodes.len()
    }

    /// The tokens of the path to `s`, its last first.
    fn path(&self, mut s: u32) -> Vec<u32> {
        let mut tokens = Vec::new();
        while s != 0 {
            let n = self.node(s);
            tokens.push(n.token);
            s = n.parent;
        }
        tokens
    }
}

/// `v` copied with room for `extra` more.
fn with_room<T: Copy>(v: &[T], extra: usize) -> Vec<T> {
    let mut copy = Vec::with_capacity(v.len() + extra);
    copy.extend_from_slice(v);
    copy
}

/// Whether server node `u`'s path ends with `path` (last token first), read in the server's
/// trie alone (its nodes' paths are never changed).
fn ends_with(base: &ContextGraph, mut u: u32, path: &[u32]) -> bool {
    path.iter().all(|&token| {
        let n = &base.nodes[u as usize];
        u = n.parent;
        n.token == token
    })
}

impl Nodes for Overlay<'_> {
    fn node(&self, id: u32) -> &TrieNode {
        match id.checked_sub(self.base.nodes.len() as u32) {
            Some(new) => &self.added[new as usize],
            None => self
                .changed
                .get(&id)
                .unwrap_or(&self.base.nodes[id as usize]),
        }
    }

    fn node_mut(&mut self, id: u32) -> &mut TrieNode {
        match id.checked_sub(self.base.nodes.len() as u32) {
            Some(new) => &mut self.added[new as usize],
            None => self
                .changed
                .entry(id)
                .or_insert(self.base.nodes[id as usize]),
        }
    }

    fn child(&self, parent: u32, token: u32) -> Option<u32> {
        self.child
            .get(&(parent, token))
            .or_else(|| self.base.child.get(&(parent, token)))
            .copied()
    }

    fn push(&mut self, node: TrieNode) -> u32 {
        let id = (self.base.nodes.len() + self.added.len()) as u32;
        self.child.insert((node.parent, node.token), id);
        self.added.push(node);
        id
    }
}

impl PhraseTrie {
    /// The tree of the phrases, kept with what merging more phrases into it needs.
    pub fn into_base(mut self) -> BaseTree {
        let cfg = &self.config;
        self.graph.fill_fail();
        let (mut tree, state_of) =
            BoostingTree::laid_out(&self.graph, self.vocab, cfg.unk_score, cfg.uniform_weights);
        tree.alpha = cfg.alpha;
        tree.phrases = self.seen.len();
        let failed_by = FailIndex::new(&self.graph);
        BaseTree {
            trie: self,
            tree: Arc::new(tree),
            state_of,
            failed_by,
        }
    }
}

impl BaseTree {
    /// The tree of the server's phrases.
    pub fn tree(&self) -> &Arc<BoostingTree> {
        &self.tree
    }

    /// The tree of these phrases and then `phrases` (numbered after these in errors, as
    /// [`PhraseTrie::add`] numbers them), as [`BoostingTree::new`] would build it from all of
    /// them, up to the states' numbering. `self` is left as it was, on an error too.
    pub fn merge(&self, tokenizer: &Tokenizer, phrases: &[String]) -> Result<BoostingTree> {
        let mut request = HashSet::new();
        let mut tokens = Vec::new();
        for (i, phrase) in phrases.iter().enumerate() {
            let number = self.trie.given + i + 1;
            let given = |p: &str| request.contains(p);
            if let Some(t) = self.trie.tokens(tokenizer, phrase, number, given)? {
                tokens.push(t);
                request.insert(phrase.as_str());
            }
        }
        Ok(self.merge_tokens(&tokens))
    }

    /// [`merge`](Self::merge) of phrases already tokenised, each with its per-token score.
    fn merge_tokens(&self, phrases: &[(Vec<u32>, f64)]) -> BoostingTree {
        let BoostingConfig {
            depth_scaling,
            uniform_weights: uniform,
            ..
        } = self.trie.config;
        let base = &self.trie.graph;
        let mut t = Overlay {
            base,
            changed: HashMap::new(),
            added: Vec::new(),
            child: HashMap::new(),
        };
        for (ids, score) in phrases {
            t.add(ids, *score, widen(depth_scaling), uniform);
        }
        // Scores the request changed (before any fail arc is re-pointed below): the nodes
        // failing to such a node back off by a different weight.
        let rescored: Vec<u32> = t
            .changed
            .iter()
            .filter(|&(&id, n)| {
                n.node_score.to_bits() != base.nodes[id as usize].node_score.to_bits()
            })
            .map(|(&id, _)| id)
            .collect();
        let first_new = base.nodes.len() as u32;
        let mut added: Vec<u32> = (first_new..first_new + t.added.len() as u32).collect();
        added.sort_by_key(|&id| t.node(id).level);
        let levels: Vec<(u32, u32)> = added.iter().map(|&id| (t.node(id).level, id)).collect();
        // Fail arcs level by level over the union. A server node whose longest suffix is now
        // a new node `s` had for its fail arc the longest server suffix of `s`, and ends with
        // `s`'s token; re-pointed at the shallower levels first, it ends at its longest.
        for level in levels.chunk_by(|a, b| a.0 == b.0) {
            for &(_, s) in level {
                let fail = t.fail_of(s);
                t.node_mut(s).fail = fail;
            }
            for &(depth, s) in level {
                let mut server_suffix = t.node(s).fail;
                while !t.is_base(server_suffix) {
                    server_suffix = t.node(server_suffix).fail;
                }
                let path = t.path(s);
                for &u in self.failed_by.failing_to_with(base, server_suffix, path[0]) {
                    if base.nodes[u as usize].level > depth && ends_with(base, u, &path) {
                        t.node_mut(u).fail = s;
                    }
                }
            }
        }

        let mut by_parent = added.clone();
        by_parent.sort_by_key(|&id| (t.node(id).parent, t.node(id).token));
        let parents = || {
            by_parent
                .chunk_by(|&a, &b| t.node(a).parent == t.node(b).parent)
                .map(|children| (t.node(children[0]).parent, children))
        };
        // The server's arrays copied with room for what the request adds (pushing past a
        // copy's capacity would copy them again).
        let rewritten: usize = parents()
            .filter(|&(parent, _)| parent != 0 && t.is_base(parent))
            .map(|(parent, _)| {
                let s = self.tree.states[self.state_of[parent as usize] as usize];
                (s.arcs_end - s.arcs_start) as usize
            })
            .sum();
        let mut tree = BoostingTree {
            states: with_room(&self.tree.states, added.len()),
            arcs: with_room(&self.tree.arcs, added.len() + rewritten),
            ..*self.tree
        };
        let mut state_of_added = vec![0u32; t.added.len()];
        for &id in &added {
            state_of_added[(id - first_new) as usize] = tree.states.len() as u32;
            tree.states.push(BoostState {
                arcs_start: 0,
                arcs_end: 0,
                order: t.node(id).level + 1,
                backoff_to: 0,
                backoff_w: 0.0,
                final_w: 0.0,
            });
        }
        let state = |id: u32| match id.checked_sub(first_new) {
            Some(new) => state_of_added[new as usize],
            None => self.state_of[id as usize],
        };
        // Backoffs: of the new nodes, of the changed ones (scores, ends, fail arcs), and of the
        // nodes failing to a node rescored.
        let failing = rescored
            .iter()
            .flat_map(|&n| self.failed_by.failing_to(n).iter().copied());
        let touched = added.iter().chain(t.changed.keys()).copied().chain(failing);
        for id in touched {
            let (fail, backoff_w, final_w) = t.backoff(id, uniform);
            let s = &mut tree.states[state(id) as usize];
            s.backoff_to = state(fail);
            s.backoff_w = backoff_w;
            s.final_w = final_w;
        }
        // Arcs to the new nodes: the start state's arc for the label; another parent's list
        // rewritten at the end, its old arcs and new ones sorted by label.
        let arc_to = |id: u32| {
            let n = t.node(id);
            BoostArc {
                from: state(n.parent),
                to: state(id),
                label: n.token,
                weight: t.arc_weight(id, uniform),
            }
        };
        for (parent, children) in parents() {
            if parent == 0 {
                for &c in children {
                    tree.arcs[t.node(c).token as usize] = arc_to(c);
                }
                continue;
            }
            let s = tree.states[state(parent) as usize];
            let mut list: Vec<BoostArc> =
                tree.arcs[s.arcs_start as usize..s.arcs_end as usize].to_vec();
            list.extend(children.iter().map(|&c| arc_to(c)));
            list.sort_by_key(|a| a.label);
            let s = &mut tree.states[state(parent) as usize];
            s.arcs_start = tree.arcs.len() as u32;
            s.arcs_end = s.arcs_start + list.len() as u32;
            tree.arcs.extend(list);
        }
        // The arcs to the server's nodes the request changed.
        for (&id, n) in &t.changed {
            let s = tree.states[state(n.parent) as usize];
            let arcs = &mut tree.arcs[s.arcs_start as usize..s.arcs_end as usize];
            let at = if n.parent == 0 {
                n.token as usize
            } else {
                arcs.binary_search_by_key(&n.token, |a| a.label)
                    .expect("a trie node has its arc")
            };
            arcs[at].weight = t.arc_weight(id, uniform);
        }
        tree.phrases += phrases.len();
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::super::BoostCursor;
    use super::*;

    /// xorshift64*: random phrase sets and walks, the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
    }

    /// `count` phrases of tokens below `alphabet`: fresh ones, and prefixes, suffixes and
    /// extensions of earlier ones (of `earlier` too), each with its per-token score.
    fn phrases(
        rng: &mut Rng,
        count: usize,
        alphabet: usize,
        earlier: &[(Vec<u32>, f64)],
        scores: &[f64],
    ) -> Vec<(Vec<u32>, f64)> {
        let mut out: Vec<(Vec<u32>, f64)> = Vec::new();
        for _ in 0..count {
            let fresh = |rng: &mut Rng, n: usize| -> Vec<u32> {
                (0..n).map(|_| rng.below(alphabet) as u32).collect()
            };
            let pool = earlier.len() + out.len();
            let mut tokens = if pool == 0 || rng.below(3) == 0 {
                let n = 1 + rng.below(6);
                fresh(rng, n)
            } else {
                let i = rng.below(pool);
                let old = if i < earlier.len() {
                    &earlier[i].0
                } else {
                    &out[i - earlier.len()].0
                };
                let cut = rng.below(old.len());
                match rng.below(3) {
                    0 => old[..=cut].to_vec(),
                    1 => old[cut..].to_vec(),
                    _ => {
                        let n = 1 + rng.below(3);
                        [old.clone(), fresh(rng, n)].concat()
                    }
                }
            };
            tokens.truncate(8);
            out.push((tokens, scores[rng.below(scores.len())]));
        }
        out
    }

    fn graph(phrases: &[(Vec<u32>, f64)], depth_scaling: f64, uniform: bool) -> ContextGraph {
        let mut g = ContextGraph::new();
        for (tokens, score) in phrases {
            g.add(tokens, *score, depth_scaling, uniform);
        }
        g.fill_fail();
        g
    }

    /// Every bonus of every label, from the states that many random label sequences reach in
    /// each tree: the same f32 bits (`advance`, `advance_all` and the cursor's alpha-scaled
    /// rows), and states of the same depth (so the same trie node: both are the suffix of the
    /// sequence of that length) with the same final weight.
    fn assert_same_automaton(
        merged: &BoostingTree,
        whole: &BoostingTree,
        rng: &mut Rng,
        mut label: impl FnMut(&mut Rng) -> usize,
    ) {
        let vocab = whole.vocab;
        let (mut a, mut a_next) = (vec![0.0f32; vocab], vec![0u32; vocab]);
        let (mut b, mut b_next) = (vec![0.0f32; vocab], vec![0u32; vocab]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for _ in 0..40 {
            let (mut ours, mut theirs) = (merged.start(), whole.start());
            for step in 0..25 {
                merged.advance_all(ours, &mut a, &mut a_next);
                whole.advance_all(theirs, &mut b, &mut b_next);
                assert_eq!(bits(&a), bits(&b), "step {step}: bonuses");
                for l in 0..vocab {
                    let order = |t: &BoostingTree, s: u32| t.states[s as usize].order;
                    assert_eq!(order(merged, a_next[l]), order(whole, b_next[l]));
                    let (w, to) = merged.advance(ours, l);
                    assert_eq!((w.to_bits(), to), (a[l].to_bits(), a_next[l]));
                }
                let cursor = |t, s| bits(BoostCursor::at(t, s).bonus());
                assert_eq!(cursor(merged, ours), cursor(whole, theirs));
                assert_eq!(merged.final_score(ours), whole.final_score(theirs));
                let l = label(rng);
                (ours, theirs) = (a_next[l], b_next[l]);
            }
        }
    }

    /// A server's random phrases merged with a request's give the automaton of the tree built
    /// from all of them: shared prefixes, phrases that are suffixes or prefixes of others
    /// (ending at inner nodes), new first tokens, uniform and depth-scaled weights, and
    /// per-phrase scores (the larger token score wins on a shared node).

    #[test]
    fn a_merged_tree_is_the_tree_of_all_the_phrases() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let vocab = 7;
        for case in 0..240 {
            let uniform = case % 2 == 1;
            let scores: &[f64] = if case % 3 == 0 {
                &[0.25, 0.5, 1.33, 2.0]
            } else {
                &[1.0]
            };
            let depth_scaling = [2.0, 1.5][case % 4 / 2];
            let unk_score = [0.0, -0.5][case % 5 % 2] as f32;
            let (n_server, n_request) = (1 + rng.below(40), 1 + rng.below(8));
            let server = phrases(&mut rng, n_server, 5, &[], scores);
            let request = phrases(&mut rng, n_request, 6, &server, scores);
            let trie = PhraseTrie {
                graph: graph(&server, depth_scaling, uniform),
                seen: HashSet::new(),
                given: server.len(),
                config: BoostingConfig {
                    alpha: 0.7,
                    depth_scaling: depth_scaling as f32,
                    unk_score,
                    uniform_weights: uniform,
                    ..BoostingConfig::default()
                },
                vocab,
            };
            let base = trie.into_base();
            let before = (base.tree.states.clone(), base.tree.arcs.clone());
            let merged = base.merge_tokens(&request);
            let all = [server, request].concat();
            let mut whole = BoostingTree::from_graph(
                &graph(&all, depth_scaling, uniform),
                vocab,
                unk_score,
                uniform,
            );
            whole.alpha = 0.7;
            assert_eq!(merged.states.len(), whole.states.len(), "case {case}");
            assert_same_automaton(&merged, &whole, &mut rng, |rng| rng.below(vocab));
            assert_eq!((&base.tree.states, &base.tree.arcs), (&before.0, &before.1));
        }
    }

    /// A request's phrases (sharing prefixes and suffixes with the server's, one repeated)
    /// tokenised by the model's SentencePiece model and merged: the automaton of the tree built
    /// from all of them, along their own tokens. A bad request phrase is named, numbered after
    /// the server's, and leaves the server's tree as it was.
    #[test]
    fn request_phrases_merge_into_the_tree_of_all_of_them() {
        let tok = super::super::tests::tokenizer();
        let owned = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let (server, mut request) = super::super::tests::server_and_request();
        request.push("graphs".into());
        let mut rng = Rng(7);
        for (uniform_weights, score_per_phrase) in [(false, 0.0), (true, 0.0), (false, 9.0)] {
            let cfg = |phrases: Vec<String>| BoostingConfig {
                phrases,
                alpha: 0.5,
                depth_scaling: 1.5,
                uniform_weights,
                score_per_phrase,
                ..BoostingConfig::default()
            };
            let base = PhraseTrie::new(&tok, &cfg(server.clone()))
                .unwrap()
                .into_base();
            let merged = base.merge(&tok, &request).unwrap();
            let all = [server.clone(), request.clone()].concat();
            let whole = BoostingTree::new(&tok, &cfg(all.clone())).unwrap();
            assert_eq!((merged.phrases(), merged.alpha()), (7, 0.5));
            let tokens: Vec<Vec<u32>> = all.iter().map(|p| tok.encode(p).unwrap()).collect();
            let mut stream = Vec::new();
            assert_same_automaton(&merged, &whole, &mut rng, |rng| {
                if stream.is_empty() {
                    stream = tokens[rng.below(tokens.len())].clone();
                    if rng.below(4) == 0 {
                        stream.push(rng.below(tok.len()) as u32);
                    }
                    stream.reverse();
                }
                stream.pop().unwrap() as usize
            });
            let before = (base.tree.states.clone(), base.tree.arcs.clone());
            let e = base
                .merge(&tok, &owned(&["fine", " "]))
                .unwrap_err()
                .to_string();
            assert_eq!(e, "boost phrase 6 (\" \") is empty");
            assert_eq!((&base.tree.states, &base.tree.arcs), (&before.0, &before.1));
            assert_eq!(base.tree.phrases(), 4);
        }
    }
}
