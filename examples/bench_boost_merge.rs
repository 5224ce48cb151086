//! A request's own boost phrase on top of a large server-wide list, for N made-up phrases: the
//! tree built from every phrase again, the request's phrase added to a copy of the server's
//! tokenised trie (`PhraseTrie`) and the whole tree laid out again, and the request's phrase
//! merged into the server's built tree (`BaseTree::merge`, what `parakeet serve` does).
//!
//! ```sh
//! cargo run --release --example bench_boost_merge -- MODEL.gguf [PHRASES] [REPS]
//! ```

use parakeet::decoder::boosting::{BoostingConfig, BoostingTree, PhraseTrie};
use parakeet::model::Model;
use parakeet::tokenizer::Tokenizer;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = Model::load(std::path::Path::new(&args[0]))?;
    let n: usize = args.get(1).map_or(Ok(100_000), |s| s.parse())?;
    let reps: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let syllables = [
        "ka", "lo", "mi", "ter", "pon", "dra", "vel", "sun", "qui", "zor",
    ];
    let server: Vec<String> = (0..n)
        .map(|i| {
            let (mut word, mut k) = (String::new(), i);
            for _ in 0..5 {
                word.push_str(syllables[k % 10]);
                k /= 10;
            }
            format!("{word} {}", syllables[i % 7])
        })
        .collect();
    let cfg = |phrases: Vec<String>| BoostingConfig {
        phrases,
        alpha: 1.0,
        ..BoostingConfig::default()
    };
    let tokenizer = &model.tokenizer();
    let start = Instant::now();
    let trie = PhraseTrie::new(tokenizer, &cfg(server.clone()))?;
    println!(
        "{n} phrases tokenised into the server's trie once: {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let start = Instant::now();
    let base = trie.clone().into_base();
    println!(
        "the server's tree built for merging, once: {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    for rep in 0..reps {
        let request = vec![format!("parakeet number {rep}")];
        let start = Instant::now();
        let rebuilt =
            BoostingTree::new(tokenizer, &cfg([server.clone(), request.clone()].concat()))?;
        let rebuild = start.elapsed();
        let start = Instant::now();
        let mut extended = trie.clone();
        extended.add(tokenizer, &request)?;
        let merged = extended.into_tree();
        let relayout = start.elapsed();
        assert!(merged.states() == rebuilt.states() && merged.arcs() == rebuilt.arcs());
        let start = Instant::now();
        let incremental = base.merge(tokenizer, &request)?;
        let merge = start.elapsed();
        assert_eq!(incremental.states().len(), rebuilt.states().len());
        same_bonuses(&incremental, &rebuilt, tokenizer, &request[0])?;
        println!(
            "request {rep}: every phrase again {:.0} ms, added to the trie and laid out again \
             {:.0} ms, merged into the server's tree {:.1} ms ({} states)",
            rebuild.as_secs_f64() * 1e3,
            relayout.as_secs_f64() * 1e3,
            merge.as_secs_f64() * 1e3,
            merged.states().len()
        );
    }
    Ok(())
}

/// The bonuses of every label along the request phrase's tokens, the same bits in both trees.
fn same_bonuses(
    a: &BoostingTree,
    b: &BoostingTree,
    tokenizer: &Tokenizer,
    phrase: &str,
) -> anyhow::Result<()> {
    let v = a.vocab_size();
    let (mut sa, mut na, mut sb, mut nb) = (vec![0.0; v], vec![0; v], vec![0.0; v], vec![0; v]);
    let (mut x, mut y) = (a.start(), b.start());
    for id in tokenizer.encode(phrase)? {
        a.advance_all(x, &mut sa, &mut na);
        b.advance_all(y, &mut sb, &mut nb);
        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        anyhow::ensure!(bits(&sa) == bits(&sb), "the merged tree's bonuses differ");
        (x, y) = (na[id as usize], nb[id as usize]);
    }
    Ok(())
}
