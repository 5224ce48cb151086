"""Type hints of the native module (re-exported by ``parakeet``)."""

import os
import pathlib
from typing import Dict, List, Optional, Sequence, Tuple, Union, overload

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
    def word(self) -> str:
        """The word, as written in the text."""
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
    def speech(self) -> Optional[List[Tuple[float, float]]]:
        """With ``vad=``, the speech segments transcribed (seconds); else None."""
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
    ``kernels``: ``"auto"`` (our CPU kernels) or ``"ggml"`` (ggml's built-in ops only, as the
    command line's ``--kernels ggml``: a diagnostic, slower on a CPU).
    ``device``: as the command line's ``--device``: ``"auto"`` (the first GPU this build can
    use, else the CPU), ``"cpu"``, ``"vulkan[:N]"``, ``"cuda[:N]"`` or ``"metal"``; a device
    this build or machine lacks is a ``ValueError`` naming it.
    """

    def __init__(
        self,
        model: Path,
        threads: Optional[int] = None,
        workers: Optional[int] = None,
        kernels: str = "auto",
        device: str = "auto",
    ) -> None: ...
    @property
    def device(self) -> str:
        """The device its workers compute on (ggml's name and description)."""
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
        boost_file: Union[None, Path, Sequence[Path]] = None,
        boost_alpha: float = 1.0,
        beam: Optional[int] = None,
        beam_strategy: Optional[str] = None,
        nbest: int = 1,
        att_context: str = "auto",
        vad: Union[None, bool, Dict[str, object]] = None,
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
        boost_file: Union[None, Path, Sequence[Path]] = None,
        boost_alpha: float = 1.0,
        beam: Optional[int] = None,
        beam_strategy: Optional[str] = None,
        nbest: int = 1,
        att_context: str = "auto",
        vad: Union[None, bool, Dict[str, object]] = None,
        diarize: bool = False,
        diar_model: Optional[Path] = None,
    ) -> List[Transcript]:
        """Transcribe a file path, a numpy array (``sample_rate`` required), or a list of them
        (in parallel; a list back, in input order). See the module's documentation."""
    def stream(
        self,
        *,
        chunk_secs: Optional[float] = None,
        left_secs: Optional[float] = None,
        right_secs: Optional[float] = None,
        att_context: Union[None, str, Tuple[int, int]] = None,
        decoder: str = "auto",
        confidence: Optional[str] = None,
        boost: Union[None, str, Sequence[str]] = None,
        boost_file: Union[None, Path, Sequence[Path]] = None,
        boost_alpha: float = 1.0,
        max_utterance_seconds: float = 30.0,
        vad: Union[None, bool, Dict[str, float]] = None,
        threads: Optional[int] = None,
    ) -> "Stream":
        """Live transcription, as ``parakeet stream``: cache-aware streaming for a cache-aware
        model (``att_context``), NeMo's buffered pipeline for an offline one (``chunk_secs``,
        ``left_secs``, ``right_secs``)."""

StreamEvent = Dict[str, object]
"""``{"type": "partial" | "final", "text": str, "start": float, "end": float, "words":
[{"word": str, "start": float, "end": float}]}`` (a word's ``"confidence"`` with
``confidence=``), as ``parakeet stream --format jsonl`` prints them."""

class Stream:
    """A live transcription: audio in pieces of any size, events back as they complete."""

    @property
    def kind(self) -> str:
        """``"cache_aware"`` or ``"buffered"``."""
    @property
    def chunk_seconds(self) -> float:
        """Seconds of audio one step of the model takes."""
    def feed(self, samples: Samples, sample_rate: int = 16000) -> List[StreamEvent]:
        """Feeds samples (one rate per stream until ``finish``); the events they completed."""
    def finish(self) -> List[StreamEvent]:
        """Ends the input: the utterance under way ends with a final; the stream starts again."""

def vad(
    audio: Audio,
    sample_rate: Optional[int] = None,
    *,
    threads: int = 1,
    model: Optional[Path] = None,
    threshold: float = 0.5,
    neg_threshold: Optional[float] = None,
    min_speech_ms: float = 250,
    max_speech_s: Optional[float] = None,
    min_silence_ms: float = 100,
    speech_pad_ms: float = 30,
    min_silence_at_max_speech_ms: float = 98,
    legacy_max_speech_split: bool = False,
) -> List[Dict[str, Union[float, int]]]:
    """Speech segments (Silero VAD, built in) as the silero-vad package's
    ``get_speech_timestamps`` makes them: dicts of ``start``/``end`` seconds and
    ``start_sample``/``end_sample``."""

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
