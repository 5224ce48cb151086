"""Talks to a running `parakeet serve` with the official `openai` package, as an application
would, and validates every event the server sends with the package's own event models (the
lenient parsing the client itself does would accept a wrong shape silently).

Run by tests/interfaces/openai_client.rs; exits 0 when every check passes, 1 (with the reason)
otherwise, 77 when the `openai` package (or `websockets`, which its realtime client needs) is
missing.
"""

import argparse
import base64
import json
import sys
import typing
import wave

try:
    import websockets  # noqa: F401  (the realtime client's transport)
    from openai import OpenAI
    from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent
    from openai.types.beta.realtime.realtime_server_event import (
        RealtimeServerEvent as BetaServerEvent,
    )
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent
except ImportError as e:
    print(f"skipped: {e}", file=sys.stderr)
    sys.exit(77)


def models_by_type(union):
    """The event models of a server-event union, by their `type` literal."""
    if typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    table = {}
    for model in typing.get_args(union):
        for literal in typing.get_args(model.model_fields["type"].annotation):
            table[literal] = model
    return table


# The beta's first event of a transcription session, which the package has no model of (its
# clients read it loosely).
UNMODELLED = {("beta", "transcription_session.created")}


def validate(event, table, dialect):
    model = table.get(event.get("type"))
    if (dialect, event.get("type")) in UNMODELLED:
        if not isinstance(event.get("session", {}).get("id"), str):
            raise SystemExit(f"{dialect}: no session id in {event}")
        return event
    if model is None:
        raise SystemExit(f"{dialect}: {event.get('type')!r} is no server event the client knows: {event}")
    model.model_validate(event)
    return event


def check_http_stream(client, wav, want):
    with open(wav, "rb") as f:
        stream = client.audio.transcriptions.create(model="parakeet", file=f, stream=True)
        events = [e.to_dict() for e in stream]
    if not events:
        raise SystemExit("stream=True: no event")
    deltas, done = events[:-1], events[-1]
    for e in deltas:
        TranscriptionTextDeltaEvent.model_validate(e)
        if e["type"] != "transcript.text.delta":
            raise SystemExit(f"stream=True: {e} before the last event")
    TranscriptionTextDoneEvent.model_validate(done)
    if done["type"] != "transcript.text.done":
        raise SystemExit(f"stream=True: the last event is {done}")
    joined = "".join(e["delta"] for e in deltas)
    if joined != done["text"] or done["text"] != want:
        raise SystemExit(f"stream=True: deltas {joined!r}, done {done['text']!r}, want {want!r}")
    if len(deltas) < 2:
        raise SystemExit(f"stream=True: {len(deltas)} delta(s) for a whole clip")


def pcm16_16k(wav):
    with wave.open(wav, "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (16000, 1, 2):
            raise SystemExit(f"{wav}: expected 16 kHz mono 16-bit")
        return w.readframes(w.getnframes())


def check_realtime(connection, table, dialect, pcm):
    """One utterance at OpenAI's 24 kHz, as its clients send it: the session events, the item
    announced before its transcript, deltas that join to the completed transcript (not empty),
    and a usage on it. (The exact text at 16 kHz is checked against NeMo's by the Rust tests.)"""
    with connection as conn:
        seen = []

        def recv():
            event = validate(json.loads(conn.recv_bytes()), table, dialect)
            if event["type"] == "error":
                raise SystemExit(f"{dialect}: {event}")
            seen.append(event["type"])
            return event

        created = recv()
        if dialect == "ga":
            if created["type"] != "session.created" or created["session"]["type"] != "transcription":
                raise SystemExit(f"ga: first event {created}")
            update = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}
            conn.send({"type": "session.update", "session": update})
            updated = "session.updated"
        else:
            if created["type"] != "transcription_session.created":
                raise SystemExit(f"beta: first event {created}")
            conn.send({"type": "transcription_session.update", "session": {"input_audio_format": "pcm16"}})
            updated = "transcription_session.updated"
        while recv()["type"] != updated:
            pass
        for i in range(0, len(pcm), 6400):
            conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 6400]).decode()})
        conn.send({"type": "input_audio_buffer.commit"})
        deltas = ""
        while True:
            event = recv()
            if event["type"].endswith("transcription.delta"):
                deltas += event["delta"]
            if event["type"].endswith("transcription.completed"):
                break
        announce = "conversation.item.added" if dialect == "ga" else "conversation.item.created"
        first = min(i for i, t in enumerate(seen) if t.endswith("transcription.delta"))
        if announce not in seen[:first]:
            raise SystemExit(f"{dialect}: no {announce} before the first delta: {seen}")
        if not event["transcript"].strip() or deltas != event["transcript"]:
            raise SystemExit(f"{dialect}: transcript {event['transcript']!r}, deltas {deltas!r}")
        usage = event.get("usage") or {}
        if usage.get("type") != "duration" or not usage.get("seconds", 0) > 0:
            raise SystemExit(f"{dialect}: usage {usage}")


def check_server_vad(connection, table, dialect, pcm):
    """`server_vad` turn detection: the session shows it, and the audio (a second of silence
    after it, no commit) gives speech_started, speech_stopped, committed and completed for the
    same item, every event valid."""
    vad = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
    with connection as conn:

        def recv():
            event = validate(json.loads(conn.recv_bytes()), table, dialect)
            if event["type"] == "error":
                raise SystemExit(f"{dialect} server_vad: {event}")
            return event

        recv()
        if dialect == "ga":
            audio = {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": vad}}
            conn.send({"type": "session.update", "session": {"type": "transcription", "audio": audio}})
            updated = "session.updated"
        else:
            session = {"input_audio_format": "pcm16", "turn_detection": vad}
            conn.send({"type": "transcription_session.update", "session": session})
            updated = "transcription_session.updated"
        while (event := recv())["type"] != updated:
            pass
        shown = event["session"]["turn_detection"] if dialect == "beta" else event["session"]["audio"]["input"]["turn_detection"]
        if shown != vad:
            raise SystemExit(f"{dialect} server_vad: the session shows {shown}")
        pcm = pcm + bytes(2 * 24000)
        for i in range(0, len(pcm), 6400):
            conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 6400]).decode()})
        items = {}
        while True:
            event = recv()
            kind = event["type"].removeprefix("input_audio_buffer.")
            if kind in ("speech_started", "speech_stopped", "committed"):
                items.setdefault(event["item_id"], []).append(kind)
            if event["type"].endswith("transcription.completed"):
                break
        if items.get(event["item_id"]) != ["speech_started", "speech_stopped", "committed"]:
            raise SystemExit(f"{dialect} server_vad: events by item {items}, completed {event}")


def resample_24k(pcm):
    """16 kHz pcm16 to 24 kHz by linear interpolation (the beta's pcm16 rate)."""
    import array

    x = array.array("h")
    x.frombytes(pcm)
    n = len(x) * 3 // 2
    out = array.array("h", bytes(2 * n))
    for j in range(n):
        t = j * 2 / 3
        i = int(t)
        f = t - i
        b = x[i + 1] if i + 1 < len(x) else x[i]
        out[j] = int(round(x[i] * (1 - f) + b * f))
    return out.tobytes()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--wav", required=True)
    p.add_argument("--text", required=True, help="the server's own (non-streamed) text of the clip")
    args = p.parse_args()
    client = OpenAI(api_key="unused", base_url=f"http://{args.addr}/v1", websocket_base_url=f"ws://{args.addr}/v1")
    check_http_stream(client, args.wav, args.text)
    pcm = resample_24k(pcm16_16k(args.wav))
    check_realtime(client.realtime.connect(model="parakeet"), models_by_type(RealtimeServerEvent), "ga", pcm)
    beta = client.beta.realtime.connect(model="parakeet")
    check_realtime(beta, models_by_type(BetaServerEvent), "beta", pcm)
    check_server_vad(client.realtime.connect(model="parakeet"), models_by_type(RealtimeServerEvent), "ga", pcm)
    check_server_vad(client.beta.realtime.connect(model="parakeet"), models_by_type(BetaServerEvent), "beta", pcm)
    print("ok")


if __name__ == "__main__":
    main()
