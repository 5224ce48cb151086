"""Type hints of the native module (re-exported by ``parakeet``)."""

import os
import pathlib
from typing import List, Optional, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

Path = Union[str, "os.PathLike[str]"]
Samples = Union[npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.int16]]
Audio = Union[Path, Samples]

class ParakeetError(Exception):
    """A model that cannot be loaded or an input that cannot be transcribed."""

class Word:
    """A word with its time span in seconds."""

    @property
    def text(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def confidence(self) -> Optional[float]:
        """NeMo's word confidence, when ``confidence=`` was asked for."""
    @property
    def speaker(self) -> Optional[int]:
        """The Sortformer's speaker index, with ``diarize=True``."""

class Token:
    """One emitted token."""

    @property
    def id(self) -> int: ...
    @property
    def piece(self) -> str:
        """The SentencePiece piece (``▁`` marks a word start)."""
    @property
    def frame(self) -> int:
        """Encoder frame where it was emitted."""
    @property
    def duration(self) -> int:
        """TDT duration in frames (0 for RNN-T and CTC)."""
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def confidence(self) -> Optional[float]: ...

class Alternative:
    """Another hypothesis of a beam search."""

    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> List[int]: ...
    @property
    def score(self) -> float: ...

class Transcript:
    """The result of one input."""

    @property
    def text(self) -> str: ...
    @property
    def words(self) -> List[Word]: ...
    @property
    def tokens(self) -> List[Token]: ...
    @property
    def audio_seconds(self) -> float: ...
    @property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame."""
    @property
    def alternatives(self) -> List[Alternative]:
        """A beam search's N best, best first; empty for greedy decoding."""
    @property
    def timings(self) -> dict:
        """Seconds per stage: ``features``, ``encoder``, ``decoder``."""
    def to_dict(self) -> dict:
        """Plain data: text, audio_seconds, words and tokens as dicts."""

class Model:
    """A model loaded once, shared by ``workers`` sessions of ``threads`` threads each.

    ``model``: a ``.gguf`` file, a ``.nemo`` checkpoint (converted once into the cache) or a
    Hugging Face hub id (``owner/name``), as the command line's ``--model``. Defaults: one
    worker per 4 cores, the cores divided among them. Safe to share between threads.
    """

    def __init__(
        self, model: Path, threads: Optional[int] = None, workers: Optional[int] = None
    ) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> pathlib.Path:
        """The GGUF file loaded (the cached conversion for a .nemo or a hub id)."""
    @property
    def sample_rate(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @overload
    def transcribe(
        self,
        audio: Audio,
        sample_rate: Optional[int] = None,
        *,
        decoder: str = "auto",
        confidence: Optional[str] = None,
        boost: Union[None, str, Sequence[str]] = None,
        boost_alpha: float = 1.0,
        beam: Optional[int] = None,
        beam_strategy: Optional[str] = None,
        nbest: int = 1,
        att_context: str = "auto",
        diarize: bool = False,
        diar_model: Optional[Path] = None,
    ) -> Transcript: ...
    @overload
    def transcribe(
        self,
        audio: Union[List[Audio], "tuple[Audio, ...]"],
        sample_rate: Optional[int] = None,
        *,
        decoder: str = "auto",
        confidence: Optional[str] = None,
        boost: Union[None, str, Sequence[str]] = None,
        boost_alpha: float = 1.0,
        beam: Optional[int] = None,
        beam_strategy: Optional[str] = None,
        nbest: int = 1,
        att_context: str = "auto",
        diarize: bool = False,
        diar_model: Optional[Path] = None,
    ) -> List[Transcript]:
        """Transcribe a file path, a numpy array (``sample_rate`` required), or a list of them
        (in parallel; a list back, in input order). See the module's documentation."""

class SpeakerTurn:
    """One speaker's turn (NeMo's segment)."""

    @property
    def speaker(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...

class Diarization:
    """Who speaks when in one recording."""

    @property
    def segments(self) -> List[SpeakerTurn]: ...
    @property
    def probabilities(self) -> npt.NDArray[np.float32]:
        """[frames, speakers]: each speaker's probability in each frame."""
    @property
    def frame_seconds(self) -> float: ...

def diarize(
    audio: Audio,
    model: Optional[Path] = None,
    sample_rate: Optional[int] = None,
    *,
    threads: Optional[int] = None,
    params: Optional[str] = None,
    onset: Optional[float] = None,
    offset: Optional[float] = None,
    pad_onset: Optional[float] = None,
    pad_offset: Optional[float] = None,
    min_duration_on: Optional[float] = None,
    min_duration_off: Optional[float] = None,
) -> Diarization:
    """A Sortformer's speaker turns (NeMo's post-processing) and per-frame probabilities."""
