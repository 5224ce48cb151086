"""Transcribe a corpus with Ray Data: one loaded model per worker, batches of files.

    pip install . "ray[data]"
    python examples/ray_transcribe.py --model nvidia/parakeet-tdt-0.6b-v2 \
        --output transcripts/ corpus/

Each Ray actor loads the model once (a callable class given to ``map_batches``) and
transcribes a batch of paths in one call, on its own worker threads. The result is one row
per file: path, text, audio seconds and the words as JSON, written as Parquet (or printed).
On a cluster, point ``ray.init`` at it (``RAY_ADDRESS``); the model argument must resolve on
every node (a hub id, or a path on shared storage).
"""

import argparse
import json
from pathlib import Path

import ray

import parakeet

AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".m4a", ".aac", ".aiff", ".caf"}


class Transcriber:
    """A Ray actor's state: the model, loaded once when the actor starts."""

    def __init__(self, model, threads):
        self.model = parakeet.Model(model, threads=threads, workers=1)

    def __call__(self, batch):
        paths = [str(p) for p in batch["path"]]
        results = self.model.transcribe(paths)
        return {
            "path": paths,
            "text": [r.text for r in results],
            "audio_seconds": [r.audio_seconds for r in results],
            "words": [json.dumps(r.to_dict()["words"]) for r in results],
        }


def audio_files(inputs):
    """Every audio file under the inputs (files as given, directories walked, sorted)."""
    found = []
    for item in map(Path, inputs):
        if item.is_dir():
            found += sorted(p for p in item.rglob("*") if p.suffix.lower() in AUDIO_EXTENSIONS)
        else:
            found.append(item)
    return [str(p) for p in found]


def transcribe(paths, model, actors=2, threads=1, batch_size=8):
    """A Ray dataset of transcripts (path, text, audio_seconds, words) for ``paths``: a fixed
    pool of ``actors`` actors (``compute=ActorPoolStrategy``, which replaced the deprecated
    ``concurrency=``), each reserving ``threads`` CPUs."""
    return ray.data.from_items([{"path": p} for p in paths]).map_batches(
        Transcriber,
        fn_constructor_args=(model, threads),
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=threads,
    )


def fit_to_cluster(cpus, threads=None, actors=None):
    """Threads per actor and actors that the cluster's ``cpus`` can hold: an actor asking for
    more CPUs than there are would wait for them forever. Defaults: 4 threads per actor (fewer
    on a smaller machine), as many actors as the CPUs then hold."""
    cpus = max(1, int(cpus))
    threads = min(threads or 4, cpus)
    actors = actors or max(1, cpus // threads)
    if threads * actors > cpus:
        raise SystemExit(
            f"--actors {actors} x --threads {threads} needs {threads * actors} CPUs; "
            f"the Ray cluster has {cpus}"
        )
    return threads, actors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="audio files or directories")
    parser.add_argument("--model", "-m", required=True, help=".gguf, .nemo or hub id")
    parser.add_argument(
        "--actors", type=int, help="model replicas (default: as many as the CPUs hold)"
    )
    parser.add_argument(
        "--threads", type=int, help="compute threads per actor (default: 4, at most the CPUs)"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--output", help="write Parquet files here (default: print)")
    args = parser.parse_args()
    ray.init()
    threads, actors = fit_to_cluster(
        ray.cluster_resources().get("CPU", 1), args.threads, args.actors
    )
    dataset = transcribe(audio_files(args.inputs), args.model, actors, threads, args.batch_size)
    if args.output:
        dataset.write_parquet(args.output)
    else:
        for row in dataset.iter_rows():
            print(f"{row['path']}\t{row['text']}")


if __name__ == "__main__":
    main()
