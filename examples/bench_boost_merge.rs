//! A request's own boost phrase on top of a large server-wide list: the tree built from every
//! phrase again (what each such request cost before) against the request's phrase added to a
//! copy of the server's tokenised trie (`PhraseTrie`), for N made-up phrases.
//!
//! ```sh
//! cargo run --release --example bench_boost_merge -- MODEL.gguf [PHRASES] [REPS]
//! ```

use parakeet::decoder::boosting::{BoostingConfig, BoostingTree, PhraseTrie};
use parakeet::model::Model;
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
        let merge = start.elapsed();
        assert!(merged.states() == rebuilt.states() && merged.arcs() == rebuilt.arcs());
        println!(
            "request {rep}: every phrase again {:.0} ms, added to the trie {:.0} ms ({} states)",
            rebuild.as_secs_f64() * 1e3,
            merge.as_secs_f64() * 1e3,
            merged.states().len()
        );
    }
    Ok(())
}
