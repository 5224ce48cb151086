//! Phrase boosting as NeMo 3.0 does it ("GPU-PB"): the phrases, tokenised with the model's own
//! SentencePiece model, make an Aho-Corasick trie with fail arcs (NeMo's `ContextGraph`,
//! `context_biasing/context_graph_universal.py`), which is then laid out as a weighted acceptor
//! with backoff arcs (NeMo's `GPUBoostingTreeModel`, `context_biasing/boosting_graph_batched.py`).
//! A search keeps one tree state per hypothesis; [`BoostingTree::advance`] gives every label's
//! bonus from that state and the state after emitting it. The decoders add `alpha` times the
//! bonus to the non-blank scores (the greedy transducer and CTC searches of this module).
//!
//! The layout is NeMo's, state for state and arc for arc (same numbering, same f32 weights), so
//! that every bonus, and the float sums behind it, are NeMo's (a tree with a request's phrases
//! merged in, [`BaseTree::merge`], numbers its states otherwise but gives the same bonuses).
//! Bonuses are computed from the arcs when asked, not tabulated: a dense state x vocabulary
//! table for 10,000 phrases on a 1024-piece vocabulary would be hundreds of MB.

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::{bail, ensure};
use std::collections::HashMap;

mod merge;
pub use merge::BaseTree;

/// What to boost and how much: NeMo's `greedy.boosting_tree` (`BoostingTreeModelConfig`) and
/// `greedy.boosting_tree_alpha`.
#[derive(Clone, Debug, PartialEq)]
pub struct BoostingConfig {
    /// The phrases, each as the user wrote it (tokenised as NeMo's `text_to_ids`). A phrase
    /// given twice counts once.
    pub phrases: Vec<String>,
    /// Weight of the tree's bonus against the model's logits (CTC: log-probabilities).
    pub alpha: f32,
    /// Bonus of a phrase's first token.
    pub context_score: f32,
    /// Multiplies the bonus of every later token (which also gets `ln(position + 1)`).
    pub depth_scaling: f32,
    /// Bonus of a token that starts no phrase.
    pub unk_score: f32,
    /// When not 0: each phrase's token bonus is this divided by its length in characters
    /// (rounded to 2 decimals, as NeMo), instead of `context_score`.
    pub score_per_phrase: f32,
    /// Icefall's weighting: every token gets the same bonus (no depth scaling) and a phrase's
    /// last token also gets the whole phrase's bonus again.
    pub uniform_weights: bool,
}

impl Default for BoostingConfig {
    /// NeMo 3.0's defaults: `BoostingTreeModelConfig` in
    /// `nemo/collections/asr/parts/context_biasing/boosting_graph_batched.py` (context_score
    /// 1.0, depth_scaling 2.0, unk_score 0.0, score_per_phrase 0.0, uniform_weights false) and
    /// `boosting_tree_alpha: 0.0` in `GreedyBatchedRNNTInferConfig` / `GreedyCTCInferConfig`
    /// (`parts/submodules/rnnt_greedy_decoding.py`, `ctc_greedy_decoding.py`). An alpha of 0
    /// means NeMo's default boosts nothing: a caller that wants boosting sets alpha.
    fn default() -> BoostingConfig {
        BoostingConfig {
            phrases: Vec::new(),
            alpha: 0.0,
            context_score: 1.0,
            depth_scaling: 2.0,
            unk_score: 0.0,
            score_per_phrase: 0.0,
            uniform_weights: false,
        }
    }
}

/// NeMo's `final_eos_score` default: the final weight of a state that ends a phrase. It is not
/// a [`BoostingConfig`] knob because no decoder of ours reads it (see
/// [`BoostingTree::final_score`]).
const FINAL_EOS_SCORE: f32 = 1.0;

/// One state of the tree, as NeMo stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoostState {
    /// Its outgoing arcs are `arcs[arcs_start..arcs_end]`, sorted by label (the start state
    /// has one arc per label, arc `l` for label `l`).
    pub arcs_start: u32,
    pub arcs_end: u32,
    /// 1 for the start state, the trie depth + 1 for the others.
    pub order: u32,
    /// Where a label without an arc here is looked up next (the trie's fail arc).
    pub backoff_to: u32,
    /// Added to the bonus when backing off (it takes back the bonus of a phrase left unfinished).
    pub backoff_w: f32,
    /// `final_eos_score` for a state ending a phrase, else 0.
    pub final_w: f32,
}

/// One arc of the tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoostArc {
    pub from: u32,
    pub to: u32,
    pub label: u32,
    pub weight: f32,
}

/// The phrases' boosting tree, built once and read by any number of searches.
#[derive(Clone, Debug)]
pub struct BoostingTree {
    states: Vec<BoostState>,
    arcs: Vec<BoostArc>,
    vocab: usize,
    alpha: f32,
    phrases: usize,
}

/// A trie node of NeMo's `ContextGraph`, with its scores in f64 as Python computes them.
#[derive(Clone, Copy)]
struct TrieNode {
    token: u32,
    parent: u32,
    level: u32,
    token_score: f64,
    node_score: f64,
    is_end: bool,
    fail: u32,
}

/// What NeMo's trie updates read and write: the whole trie ([`ContextGraph`]), or a request's
/// phrases laid over a server's ([`Overlay`]), so that both follow the same rules.
trait Nodes {
    fn node(&self, id: u32) -> &TrieNode;
    fn node_mut(&mut self, id: u32) -> &mut TrieNode;
    fn child(&self, parent: u32, token: u32) -> Option<u32>;
    /// Adds `node` as its parent's child for its token; its id.
    fn push(&mut self, node: TrieNode) -> u32;

    /// Adds one phrase's tokens with its per-token score, as NeMo's `build` loop body. A node
    /// shared with an earlier phrase keeps the larger token score of the two, and its node
    /// score is recomputed from its parent's (its own descendants keep theirs: NeMo's order of
    /// updates, kept because the backoff weights are differences of node scores).
    fn add(&mut self, tokens: &[u32], context_score: f64, depth_scaling: f64, uniform: bool) {
        let mut node = 0u32;
        for (i, &token) in tokens.iter().enumerate() {
            let last = i + 1 == tokens.len();
            let parent_score = self.node(node).node_score;
            node = match self.child(node, token) {
                Some(existing) => {
                    let n = self.node_mut(existing);
                    n.token_score = context_score.max(n.token_score);
                    n.node_score = parent_score + n.token_score;
                    n.is_end |= last;
                    existing
                }
                None => {
                    let token_score = if i > 0 && !uniform {
                        context_score * depth_scaling + ((i + 1) as f64).ln()
                    } else {
                        context_score
                    };
                    self.push(TrieNode {
                        token,
                        parent: node,
                        level: i as u32 + 1,
                        token_score,
                        node_score: parent_score + token_score,
                        is_end: last,
                        fail: 0,
                    })
                }
            };
        }
    }

    /// The fail arc of `id` (NeMo's `_fill_fail_output` for one node): the longest proper
    /// suffix of its path that is also a path from the root, found down its parent's fail
    /// chain. Every shallower node's fail arc must be final.
    fn fail_of(&self, id: u32) -> u32 {
        let n = self.node(id);
        if n.level <= 1 {
            return 0;
        }
        let mut fail = self.node(n.parent).fail;
        loop {
            if let Some(next) = self.child(fail, n.token) {
                return next;
            }
            if fail == 0 {
                return 0;
            }
            fail = self.node(fail).fail;
        }
    }

    /// The state of node `id` as NeMo lays it out: where it backs off to (as a node), the
    /// backoff weight and the final weight.
    fn backoff(&self, id: u32, uniform: bool) -> (u32, f32, f32) {
        let n = self.node(id);
        // A finished phrase keeps its bonus on backing off (except, past the first token,
        // with uniform weights, where its last arc carries the whole phrase).
        let keep = n.is_end && (n.level == 1 || !uniform);
        let backoff_w = if keep {
            0.0
        } else {
            (self.node(n.fail).node_score - n.node_score) as f32
        };
        let final_w = if n.is_end { FINAL_EOS_SCORE } else { 0.0 };
        (n.fail, backoff_w, final_w)
    }

    /// The weight of the arc into node `id`.
    fn arc_weight(&self, id: u32, uniform: bool) -> f32 {
        let n = self.node(id);
        let weight = if uniform && n.is_end && n.level > 1 {
            n.token_score + n.node_score
        } else {
            n.token_score
        };
        weight as f32
    }
}

/// The trie with fail arcs (NeMo's `ContextGraph.build`); node 0 is the root, node ids are in
/// creation order.
#[derive(Clone)]
struct ContextGraph {
    nodes: Vec<TrieNode>,
    child: HashMap<(u32, u32), u32>,
}

impl Nodes for ContextGraph {
    fn node(&self, id: u32) -> &TrieNode {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: u32) -> &mut TrieNode {
        &mut self.nodes[id as usize]
    }

    fn child(&self, parent: u32, token: u32) -> Option<u32> {
        self.child.get(&(parent, token)).copied()
    }

    fn push(&mut self, node: TrieNode) -> u32 {
        let id = self.nodes.len() as u32;
        self.child.insert((node.parent, node.token), id);
        self.nodes.push(node);
        id
    }
}

impl ContextGraph {
    fn new() -> ContextGraph {
        ContextGraph {
            nodes: vec![TrieNode {
                token: u32::MAX,
                parent: 0,
                level: 0,
                token_score: 0.0,
                node_score: 0.0,
                is_end: false,
                fail: 0,
            }],
            child: HashMap::new(),
        }
    }

    /// The non-root nodes level by level (NeMo's breadth-first order up to the order within a
    /// level, which no fail arc depends on: a node's depends on shallower nodes' alone).
    fn by_level(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = (1..self.nodes.len() as u32).collect();
        ids.sort_by_key(|&id| self.nodes[id as usize].level);
        ids
    }

    /// The fail arcs, shallower nodes first.
    fn fill_fail(&mut self) {
        for id in self.by_level() {
            let fail = self.fail_of(id);
            self.nodes[id as usize].fail = fail;
        }
    }
}

/// The f64 a user's decimal meant: NeMo computes the trie's scores in Python floats (f64) from
/// the settings as typed, so `0.7` must become f64 0.7, not the widened f32 0.699999988. The
/// shortest decimal that reads back as the f32 is what was typed (for up to 7 digits).
fn widen(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// `round(x, 2)` as Python does it: the correctly rounded 2-decimal value (ties to even on the
/// exact binary value), which Rust's exact float formatting also gives. NeMo rounds this way
/// in its boosting scores and in its diarization post-processing (`crate::diar`).
pub fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// Phrases tokenised into NeMo's trie, before its fail arcs and layout: kept by a server so
/// that a request's own phrases are added to its `--boost-file` without tokenising those again
/// (the tokenising is most of a tree's cost). The tree of the whole is the one
/// [`BoostingTree::new`] builds from all the phrases, state for state.
#[derive(Clone)]
pub struct PhraseTrie {
    graph: ContextGraph,
    seen: std::collections::HashSet<String>,
    /// Phrases given so far, repeats included (errors number the phrases in this order).
    given: usize,
    config: BoostingConfig,
    vocab: usize,
}

impl PhraseTrie {
    /// `cfg.phrases` tokenised; the errors of [`BoostingTree::new`].
    pub fn new(tokenizer: &Tokenizer, cfg: &BoostingConfig) -> Result<PhraseTrie> {
        if !tokenizer.can_encode() {
            bail!(
                Options,
                "phrase boosting needs the model's SentencePiece tokenizer, which this model \
                 file lacks (it was converted before the tokenizer was stored): convert the \
                 .nemo again with this version"
            );
        }
        ensure!(!cfg.phrases.is_empty(), Options, "no phrases to boost");
        for (name, value) in [
            ("alpha", cfg.alpha),
            ("context score", cfg.context_score),
            ("depth scaling", cfg.depth_scaling),
            ("unk score", cfg.unk_score),
            ("score per phrase", cfg.score_per_phrase),
        ] {
            ensure!(
                value.is_finite(),
                Options,
                "the boosting {name} must be a finite number, not {value}"
            );
        }
        let mut trie = PhraseTrie {
            graph: ContextGraph::new(),
            seen: std::collections::HashSet::new(),
            given: 0,
            config: BoostingConfig {
                phrases: Vec::new(),
                ..cfg.clone()
            },
            vocab: tokenizer.len(),
        };
        trie.add(tokenizer, &cfg.phrases)?;
        Ok(trie)
    }

    /// Adds `phrases` (numbered after those given before in errors). On an error the trie may
    /// hold some of them: a caller adding a request's phrases adds them to a copy.
    pub fn add(&mut self, tokenizer: &Tokenizer, phrases: &[String]) -> Result<()> {
        for phrase in phrases {
            self.given += 1;
            // NeMo keys its phrases by text: a repeated phrase adds nothing.
            let Some((ids, score)) = self.tokens(tokenizer, phrase, self.given, |_| false)? else {
                continue;
            };
            let cfg = &self.config;
            self.graph
                .add(&ids, score, widen(cfg.depth_scaling), cfg.uniform_weights);
            self.seen.insert(phrase.clone());
        }
        Ok(())
    }

    /// Phrase `number`'s tokens and per-token score, checked; `None` for a phrase given
    /// before (in this trie, or where `given_before` says).
    fn tokens(
        &self,
        tokenizer: &Tokenizer,
        phrase: &str,
        number: usize,
        given_before: impl Fn(&str) -> bool,
    ) -> Result<Option<(Vec<u32>, f64)>> {
        let shown = || format!("boost phrase {number} ({phrase:?})");
        if phrase.trim().is_empty() {
            bail!(Options, "{} is empty", shown());
        }
        if self.seen.contains(phrase) || given_before(phrase) {
            return Ok(None);
        }
        let ids = tokenizer.encode(phrase)?;
        if ids.is_empty() {
            bail!(Options, "{} tokenises to nothing", shown());
        }
        // A bare word mark ("▁", which text in an unknown script also gets) spells nothing.
        let unknown = tokenizer.unknown_id();
        let spells =
            |id: &u32| Some(*id) != unknown && tokenizer.piece(*id as usize) != Some("\u{2581}");
        if !ids.iter().any(spells) {
            bail!(
                Options,
                "{} spells nothing in the model's vocabulary (it tokenises to <unk> and word \
                 marks only)",
                shown()
            );
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            bail!(
                Options,
                "{}: token {bad} is outside the vocabulary",
                shown()
            );
        }
        let cfg = &self.config;
        let per_phrase = round2(widen(cfg.score_per_phrase) / phrase.chars().count() as f64);
        let score = if per_phrase == 0.0 {
            widen(cfg.context_score)
        } else {
            per_phrase
        };
        Ok(Some((ids, score)))
    }

    /// Distinct phrases so far.
    pub fn phrases(&self) -> usize {
        self.seen.len()
    }

    /// The tree of the phrases: the fail arcs, then NeMo's layout.
    pub fn into_tree(mut self) -> BoostingTree {
        let cfg = &self.config;
        self.graph.fill_fail();
        let mut tree =
            BoostingTree::from_graph(&self.graph, self.vocab, cfg.unk_score, cfg.uniform_weights);
        tree.alpha = cfg.alpha;
        tree.phrases = self.seen.len();
        tree
    }
}

impl BoostingTree {
    /// Tokenises `cfg.phrases` with the model's `tokenizer` and builds NeMo's tree from them
    /// (`GPUBoostingTreeModel.from_config`). Errors name the phrase: an empty one, one that
    /// tokenises to nothing or to `<unk>` and bare word marks alone; and a tokenizer without its
    /// SentencePiece model is refused. A phrase with some unknown pieces among known ones is
    /// kept, `<unk>` and all, as NeMo keeps it.
    pub fn new(tokenizer: &Tokenizer, cfg: &BoostingConfig) -> Result<BoostingTree> {
        Ok(PhraseTrie::new(tokenizer, cfg)?.into_tree())
    }

    /// NeMo's `from_context_graph`: the start state with one arc per label (to a first token's
    /// state, else back to itself with `unk_score`), then the trie's nodes level by level, each
    /// level in (parent node, token) order, each node one state reached by one arc.
    fn from_graph(graph: &ContextGraph, vocab: usize, unk_score: f32, uniform: bool) -> Self {
        Self::laid_out(graph, vocab, unk_score, uniform).0
    }

    /// [`from_graph`](Self::from_graph), and the state of every trie node.
    fn laid_out(
        graph: &ContextGraph,
        vocab: usize,
        unk_score: f32,
        uniform: bool,
    ) -> (Self, Vec<u32>) {
        let nodes = &graph.nodes;
        let mut levels = graph.by_level();
        levels.sort_by_key(|&id| {
            let n = &nodes[id as usize];
            (n.level, n.parent, n.token)
        });
        let mut state_of = vec![u32::MAX; nodes.len()];
        state_of[0] = 0;
        let mut states = vec![BoostState {
            arcs_start: 0,
            arcs_end: vocab as u32,
            order: 1,
            backoff_to: 0,
            backoff_w: 0.0,
            final_w: 0.0,
        }];
        let mut arcs: Vec<BoostArc> = (0..vocab as u32)
            .map(|label| BoostArc {
                from: 0,
                to: 0,
                label,
                weight: unk_score,
            })
            .collect();
        for id in levels {
            let n = &nodes[id as usize];
            let from = state_of[n.parent as usize];
            let to = states.len() as u32;
            state_of[id as usize] = to;
            let (fail, backoff_w, final_w) = graph.backoff(id, uniform);
            states.push(BoostState {
                arcs_start: 0,
                arcs_end: 0,
                order: n.level + 1,
                backoff_to: state_of[fail as usize],
                backoff_w,
                final_w,
            });
            let arc = BoostArc {
                from,
                to,
                label: n.token,
                weight: graph.arc_weight(id, uniform),
            };
            if n.level == 1 {
                arcs[n.token as usize] = arc;
                continue;
            }
            let at = arcs.len() as u32;
            arcs.push(arc);
            let s = &mut states[from as usize];
            if s.arcs_start == 0 {
                s.arcs_start = at;
            }
            s.arcs_end = at + 1;
        }
        let tree = BoostingTree {
            states,
            arcs,
            vocab,
            alpha: 0.0,
            phrases: 0,
        };
        (tree, state_of)
    }

    /// The state before any token.
    pub fn start(&self) -> u32 {
        0
    }

    /// The weight of the bonus in the decoder's scores (`boosting_tree_alpha`).
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// Distinct phrases in the tree.
    pub fn phrases(&self) -> usize {
        self.phrases
    }

    /// Labels the tree knows (the model's vocabulary without the blank).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    pub fn states(&self) -> &[BoostState] {
        &self.states
    }

    pub fn arcs(&self) -> &[BoostArc] {
        &self.arcs
    }

    /// The arcs leaving `state`.
    fn arcs_of(&self, state: u32) -> &[BoostArc] {
        let s = &self.states[state as usize];
        &self.arcs[s.arcs_start as usize..s.arcs_end as usize]
    }

    /// NeMo's `advance()` for one label: the bonus of emitting `label` in `state` (not yet
    /// multiplied by alpha) and the state after it. The bonus is the first arc for `label`
    /// found along the backoff chain plus the backoff weights passed on the way (f32 sums in
    /// NeMo's order).
    pub fn advance(&self, state: u32, label: usize) -> (f32, u32) {
        assert!(
            label < self.vocab,
            "label {label} is not one of the tree's {} (the blank has no bonus)",
            self.vocab
        );
        let label = label as u32;
        let mut backoff = 0.0f32;
        let mut current = state;
        loop {
            let arcs = self.arcs_of(current);
            if current == 0 {
                // The start state has an arc for every label, arc `l` for label `l`.
                let arc = &arcs[label as usize];
                return (backoff + arc.weight, arc.to);
            }
            if let Ok(i) = arcs.binary_search_by_key(&label, |a| a.label) {
                return (backoff + arcs[i].weight, arcs[i].to);
            }
            let s = &self.states[current as usize];
            backoff += s.backoff_w;
            current = s.backoff_to;
        }
    }

    /// [`advance`](Self::advance) for every non-blank label at once (what a beam search
    /// needs): `scores` and `next` have the tree's [`vocab_size`](Self::vocab_size) entries.
    /// One walk down the backoff chain, each label taken at the first state that has it.
    pub fn advance_all(&self, state: u32, scores: &mut [f32], next: &mut [u32]) {
        assert!(
            scores.len() == self.vocab && next.len() == self.vocab,
            "advance_all over {} labels needs {} scores and next states (got {}, {})",
            self.vocab,
            self.vocab,
            scores.len(),
            next.len()
        );
        const UNSET: u32 = u32::MAX;
        next.fill(UNSET);
        let mut backoff = 0.0f32;
        let mut current = state;
        loop {
            for arc in self.arcs_of(current) {
                let l = arc.label as usize;
                if next[l] == UNSET {
                    scores[l] = backoff + arc.weight;
                    next[l] = arc.to;
                }
            }
            if current == 0 {
                break;
            }
            let s = &self.states[current as usize];
            backoff += s.backoff_w;
            current = s.backoff_to;
        }
    }

    /// The final weight of `state`: `final_eos_score` (1.0, NeMo's default) where a phrase
    /// ends, else 0 (NeMo's `get_final`). NeMo adds it only for an end-of-sentence token of
    /// attention-decoder models (Canary); its greedy and beam searches for TDT, RNN-T and CTC
    /// never read it, so neither do ours.
    pub fn final_score(&self, state: u32) -> f32 {
        self.states[state as usize].final_w
    }
}

/// A search's position in the tree with the alpha-weighted bonus of every label from there,
/// recomputed only when the state changes (on emission).
pub struct BoostCursor<'t> {
    tree: &'t BoostingTree,
    state: u32,
    bonus: Vec<f32>,
    next: Vec<u32>,
    /// The start state's arc weight and target for every label (it has one arc per label),
    /// when it does: every row is those behind the few arcs of a state's backoff chain.
    start_row: Option<(Vec<f32>, Vec<u32>)>,
    /// Labels a state's chain set before the start state's row (a few per emission).
    claimed: Vec<u32>,
}

impl<'t> BoostCursor<'t> {
    pub fn new(tree: &'t BoostingTree) -> BoostCursor<'t> {
        let start = tree.arcs_of(tree.start());
        let dense = start.len() == tree.vocab
            && start.iter().enumerate().all(|(l, a)| a.label as usize == l);
        let start_row = dense.then(|| {
            (
                start.iter().map(|a| a.weight).collect(),
                start.iter().map(|a| a.to).collect(),
            )
        });
        let mut cursor = BoostCursor {
            tree,
            state: tree.start(),
            bonus: vec![0.0; tree.vocab],
            next: vec![0; tree.vocab],
            start_row,
            claimed: Vec::new(),
        };
        cursor.load(tree.start());
        cursor
    }

    /// A cursor at `state` of `tree` (a stream's position where its last chunk left it).
    pub fn at(tree: &'t BoostingTree, state: u32) -> BoostCursor<'t> {
        let mut cursor = BoostCursor::new(tree);
        if state != cursor.state {
            cursor.load(state);
        }
        cursor
    }

    fn load(&mut self, state: u32) {
        self.state = state;
        // NeMo scales the bonus first, then adds it to the scores (both f32).
        let alpha = self.tree.alpha;
        let Some((start_w, start_to)) = &self.start_row else {
            self.tree
                .advance_all(state, &mut self.bonus, &mut self.next);
            for b in &mut self.bonus {
                *b *= alpha;
            }
            return;
        };
        // advance_all's walk with the start state's full row written in one pass: first the
        // backoff sum down the chain, then the row at that sum, then the chain's own arcs over
        // it (the first found wins), each sum in advance_all's f32 order.
        let tree = self.tree;
        let chain = || {
            std::iter::successors(Some((state, 0.0f32)), |&(current, backoff)| {
                let s = &tree.states[current as usize];
                (current != 0).then_some((s.backoff_to, backoff + s.backoff_w))
            })
        };
        let total = chain().last().map_or(0.0, |(_, backoff)| backoff);
        for ((b, n), (&w, &to)) in self
            .bonus
            .iter_mut()
            .zip(self.next.iter_mut())
            .zip(start_w.iter().zip(start_to))
        {
            *b = (total + w) * alpha;
            *n = to;
        }
        self.claimed.clear();
        for (current, backoff) in chain().take_while(|&(current, _)| current != 0) {
            for arc in tree.arcs_of(current) {
                if !self.claimed.contains(&arc.label) {
                    self.claimed.push(arc.label);
                    let l = arc.label as usize;
                    self.bonus[l] = (backoff + arc.weight) * alpha;
                    self.next[l] = arc.to;
                }
            }
        }
    }

    pub fn state(&self) -> u32 {
        self.state
    }

    /// `alpha` x the bonus of every non-blank label from the current state.
    pub fn bonus(&self) -> &[f32] {
        &self.bonus
    }

    /// The label with the highest `scores[l] + bonus[l]` over the non-blank labels (the first
    /// on ties, as torch's max), skipping `exclude`.
    pub fn best(&self, scores: &[f32], exclude: Option<usize>) -> usize {
        let mut best = None::<(usize, f32)>;
        for (l, (&s, &b)) in scores.iter().zip(&self.bonus).enumerate() {
            if Some(l) == exclude {
                continue;
            }
            let v = s + b;
            if best.is_none_or(|(_, top)| v > top) {
                best = Some((l, v));
            }
        }
        best.map_or(0, |(l, _)| l)
    }

    /// Moves past an emitted non-blank `label`.
    pub fn emit(&mut self, label: usize) {
        let to = self.next[label];
        if to != self.state {
            self.load(to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(phrases: &[&[u32]], cs: f64, ds: f64, uniform: bool) -> ContextGraph {
        let mut g = ContextGraph::new();
        for p in phrases {
            g.add(p, cs, ds, uniform);
        }
        g.fill_fail();
        g
    }

    #[test]
    fn settings_widen_to_the_decimal_typed() {
        assert_eq!(widen(0.7), 0.7);
        assert_eq!(widen(1.5), 1.5);
        assert_eq!(widen(-0.3), -0.3);
        assert_eq!(widen(0.123_456_7), 0.123_456_7);
    }

    #[test]
    fn python_rounding_to_two_decimals() {
        assert_eq!(round2(0.125), 0.12);
        assert_eq!(round2(6.0 / 7.0), 0.86);
        assert_eq!(round2(2.675), 2.67);
        assert_eq!(round2(1.5), 1.5);
    }

    #[test]
    fn fail_arcs_follow_the_longest_suffix() {
        // "a b c" and "b c d": c's suffix "b c" is a path, so a-b-c fails to b-c.
        let g = graph(&[&[1, 2, 3], &[2, 3, 4]], 1.0, 2.0, false);
        let path = |toks: &[u32]| toks.iter().fold(0u32, |n, t| g.child[&(n, *t)]);
        assert_eq!(g.nodes[path(&[1, 2, 3]) as usize].fail, path(&[2, 3]));
        assert_eq!(g.nodes[path(&[1, 2]) as usize].fail, path(&[2]));
        assert_eq!(g.nodes[path(&[2, 3, 4]) as usize].fail, 0);
    }

    #[test]
    fn bonuses_follow_backoffs_and_all_labels_agree_with_one() {
        let g = graph(&[&[1, 2, 3], &[2, 3, 4], &[1]], 1.0, 2.0, false);
        let mut tree = BoostingTree::from_graph(&g, 6, -0.5, false);
        tree.alpha = 1.0;
        // From the start: the first tokens get context_score, the rest unk_score.
        assert_eq!(tree.advance(0, 1).0, 1.0);
        assert_eq!(tree.advance(0, 5), (-0.5, 0));
        // After "1 2", label 3 continues with 2 + ln 3; label 5 backs off to the start state
        // paying back the unfinished phrase's bonus.
        let (_, s1) = tree.advance(0, 1);
        let (_, s12) = tree.advance(s1, 2);
        let (w, _) = tree.advance(s12, 3);
        assert!((w - (2.0 + 3f32.ln())).abs() < 1e-6);
        let (w, to) = tree.advance(s12, 5);
        assert_eq!(to, 0);
        assert!((w - (-(1.0 + 2.0 + 2f32.ln()) - 0.5)).abs() < 1e-5, "{w}");
        let (mut scores, mut next) = (vec![0.0; 6], vec![0; 6]);
        for state in 0..tree.states().len() as u32 {
            tree.advance_all(state, &mut scores, &mut next);
            for label in 0..6 {
                assert_eq!(tree.advance(state, label), (scores[label], next[label]));
            }
        }
    }

    #[test]
    fn cursor_picks_boosted_non_blank_labels() {
        let g = graph(&[&[2]], 3.0, 2.0, false);
        let mut tree = BoostingTree::from_graph(&g, 3, 0.0, false);
        tree.alpha = 0.5;
        let mut c = BoostCursor::new(&tree);
        assert_eq!(c.best(&[1.0, 0.0, 0.0], None), 2);
        assert_eq!(c.best(&[1.0, 0.0, 0.0], Some(2)), 0);
        c.emit(2);
        assert_eq!(c.state(), 1);
        // A finished one-token phrase keeps its bonus.
        assert_eq!(c.bonus(), &[0.0, 0.0, 1.5]);
    }

    pub(super) fn tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tokenizers/spe_bpe_v1024.model"
        );
        Tokenizer::with_sentencepiece(&std::fs::read(path).unwrap()).unwrap()
    }

    /// A server's phrases, and a request's sharing prefixes and suffixes with them, one of
    /// them repeated.
    pub(super) fn server_and_request() -> (Vec<String>, Vec<String>) {
        let owned = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let server = [
            "nvidia parakeet",
            "cuda graphs",
            "speech recognition",
            "nemo",
        ];
        let request = ["parakeet tdt", "graphs", "nemo", "recognition speech"];
        (owned(&server), owned(&request))
    }

    /// A server's phrases extended by a request's (sharing prefixes and suffixes with them,
    /// one repeated): the same tree as built from all of them at once, state for state and
    /// arc for arc; a bad request phrase is numbered after the server's.
    #[test]
    fn phrases_added_to_a_trie_give_the_tree_of_all_of_them() {
        let tok = tokenizer();
        let owned = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let (server, request) = server_and_request();
        for uniform_weights in [false, true] {
            let cfg = |phrases: Vec<String>| BoostingConfig {
                phrases,
                alpha: 0.5,
                depth_scaling: 1.5,
                uniform_weights,
                ..BoostingConfig::default()
            };
            let trie = PhraseTrie::new(&tok, &cfg(server.clone())).unwrap();
            let mut extended = trie.clone();
            extended.add(&tok, &request).unwrap();
            let merged = extended.into_tree();
            let whole =
                BoostingTree::new(&tok, &cfg([server.clone(), request.clone()].concat())).unwrap();
            assert_eq!(merged.states(), whole.states());
            assert_eq!(merged.arcs(), whole.arcs());
            assert_eq!((merged.phrases(), merged.alpha()), (7, 0.5));
            // The server's own trie is untouched by a request's phrases.
            assert_eq!(trie.into_tree().phrases(), 4);
        }
        let mut bad = PhraseTrie::new(
            &tok,
            &BoostingConfig {
                phrases: server.clone(),
                ..BoostingConfig::default()
            },
        )
        .unwrap();
        let e = bad
            .add(&tok, &owned(&["fine", " "]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "boost phrase 6 (\" \") is empty");
    }

    #[test]
    fn ten_thousand_phrases_build_without_dense_tables() {
        let tok = tokenizer();
        // Distinct made-up words, several pieces each.
        let syllables = [
            "ka", "lo", "mi", "ter", "pon", "dra", "vel", "sun", "qui", "zor",
        ];
        let phrases: Vec<String> = (0..10_000usize)
            .map(|i| {
                let mut w = String::new();
                let mut n = i;
                for _ in 0..4 {
                    w.push_str(syllables[n % 10]);
                    n /= 10;
                }
                format!("{w} {}", syllables[i % 7])
            })
            .collect();
        let cfg = BoostingConfig {
            phrases,
            alpha: 1.0,
            ..BoostingConfig::default()
        };
        let tree = BoostingTree::new(&tok, &cfg).unwrap();
        assert_eq!(tree.phrases(), 10_000);
        assert!(tree.states().len() > 10_000);
        // Arcs: one per trie node beyond the first level, plus the start state's vocabulary.
        assert_eq!(
            tree.arcs().len(),
            tree.states().len() - 1 + tok.len() - first_level(&tree)
        );
        // The cursor's rows (the start state's row plus the chain's arcs) are alpha x
        // advance_all's, bit for bit, in every state.
        let mut tree = tree;
        tree.alpha = 0.7;
        let mut cursor = BoostCursor::new(&tree);
        let (mut scores, mut next) = (vec![0.0; tree.vocab], vec![0; tree.vocab]);
        for state in (0..tree.states().len() as u32).step_by(7) {
            cursor.load(state);
            tree.advance_all(state, &mut scores, &mut next);
            let scaled: Vec<u32> = scores.iter().map(|&b| (b * 0.7).to_bits()).collect();
            let ours: Vec<u32> = cursor.bonus().iter().map(|b| b.to_bits()).collect();
            assert_eq!(ours, scaled, "state {state}");
            assert_eq!(cursor.next, next, "state {state}");
        }
    }

    fn first_level(tree: &BoostingTree) -> usize {
        tree.states().iter().filter(|s| s.order == 2).count()
    }

    #[test]
    fn bad_phrases_are_named() {
        let tok = tokenizer();
        let err = |phrases: &[&str]| {
            let cfg = BoostingConfig {
                phrases: phrases.iter().map(|s| s.to_string()).collect(),
                alpha: 1.0,
                ..BoostingConfig::default()
            };
            format!("{:#}", BoostingTree::new(&tok, &cfg).unwrap_err())
        };
        assert!(err(&["ok", ""]).contains("boost phrase 2 (\"\") is empty"));
        assert!(err(&["  "]).contains("is empty"));
        assert!(err(&[]).contains("no phrases"));
        let cfg = BoostingConfig {
            phrases: vec!["hello".into()],
            alpha: f32::NAN,
            ..BoostingConfig::default()
        };
        let e = format!("{:#}", BoostingTree::new(&tok, &cfg).unwrap_err());
        assert!(e.contains("alpha must be a finite number"), "{e}");
        // "▁" and <unk>, or word marks alone: nothing the vocabulary spells.
        assert!(err(&["日本"]).contains("boost phrase 1 (\"日本\") spells nothing"));
        let e = err(&["x", "\u{200b}"]);
        // Shown escaped, as Rust debug-prints an invisible character.
        assert!(
            e.contains(r#"boost phrase 2 ("\u{200b}") spells nothing"#),
            "{e}"
        );
        let no_sp = Tokenizer::new(tok.pieces().to_vec());
        let cfg = BoostingConfig {
            phrases: vec!["hello".into()],
            ..BoostingConfig::default()
        };
        let e = format!("{:#}", BoostingTree::new(&no_sp, &cfg).unwrap_err());
        assert!(e.contains("convert the .nemo again"), "{e}");
    }
}
