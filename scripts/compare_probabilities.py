#!/usr/bin/env python3
"""Our per-frame speaker probabilities (`parakeet diarize -f json --probabilities`) against
NeMo's (a [frames, speakers] .npy, e.g. from nemo_full_sortformer.py): frame counts, the largest
absolute difference, and where it lies.

  compare_probabilities.py OURS.diar.json NEMO.npy [TOLERANCE]   (exit 1 above the tolerance)
"""
import json
import sys

import numpy as np


def main():
    ours = np.array(json.load(open(sys.argv[1]))["probabilities"], dtype=np.float64)
    nemo = np.load(sys.argv[2]).astype(np.float64)
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    if ours.shape != nemo.shape:
        print(f"shapes differ: ours {ours.shape}, NeMo {nemo.shape}")
        sys.exit(1)
    diff = np.abs(ours - nemo)
    frame, spk = np.unravel_index(diff.argmax(), diff.shape)
    print(f"{ours.shape[0]} frames x {ours.shape[1]} speakers: max abs err {diff.max():.2e} "
          f"(frame {frame}, speaker {spk}), mean {diff.mean():.2e}; NeMo's range "
          f"{nemo.min():.3f}..{nemo.max():.3f}")
    sys.exit(0 if diff.max() <= tol else 1)


if __name__ == "__main__":
    main()
