"""The page of `parakeet serve` in a real, headless Chromium (driven by chromedriver).

Run by scripts/ci_browser.sh, which installs what it needs; by hand:
    python tests/browser/test_page.py --binary target/debug/parakeet --out target/browser

Asserts, against the tiny fixture models (random weights: gibberish, compared exactly):
- without the API key the page is refused (it says so and asks for the key) and so is the socket;
- a dropped file's transcript equals `parakeet transcribe`'s for the same options, a picked one
  too (with VAD and a boosted phrase), and the srt download equals `transcribe -f srt`'s file;
- clicking a word seeks the audio there; low-confidence words are marked; speakers are drawn;
- a refused file shows the API's own error message;
- the live captions' finals equal `parakeet stream`'s on the audio the microphone gave (the
  fake microphone plays a clip; the audio sent is checked to be that clip);
- accessibility: names, contrast and keyboard use (our checks, and axe-core when installed);
- first paint and the page's weight, and the live captions' delay after their events, printed
  and held to their targets. Screenshots of each state go to --out.
"""

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
KEY = "sk-browser-test_42"
CLIP = FIXTURES / "audio" / "speech_10s.wav"
# The targets of the page.
FIRST_PAINT_MS = 300
PAGE_BYTES = 200 * 1024
CAPTION_DELAY_MS = 100
# The server's VAD (OpenAI's server_vad defaults), as `stream --vad` takes them.
SERVER_VAD = ["--threshold", "0.5", "--min-silence-ms", "500", "--speech-pad-ms", "300"]

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


class Server:
    """`parakeet serve` on a free port, its stderr kept."""

    def __init__(self, binary, cache, args):
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", *args],
            env={**os.environ, "PARAKEET_CACHE": str(cache), "GGML_NO_BACKTRACE": "1"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on http://" in line:
                self.addr = line.split("listening on http://")[1].strip()
                break
        else:
            raise SystemExit("the server did not start:\n" + "".join(self.log))
        self.url = "http://" + self.addr

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def http(url, headers=None, data=None, method=None):
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def multipart(fields, file_name, data):
    boundary = "----parakeet-browser-test"
    body = b""
    for k, v in fields:
        body += f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
    body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def browser(out, downloads, fake_audio=None):
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="parakeet-chromium-")
    # Root needs --no-sandbox; this closed network refuses Chromium's background connections.
    for a in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1100,1000", "--autoplay-policy=no-user-gesture-required",
              f"--user-data-dir={profile}"]:
        opts.add_argument(a)
    if fake_audio:
        opts.add_argument("--use-fake-device-for-media-stream")
        opts.add_argument("--use-fake-ui-for-media-stream")
        opts.add_argument(f"--use-file-for-fake-audio-capture={fake_audio}%noloop")
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    opts.add_experimental_option("prefs", {
        "download.default_directory": str(downloads), "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=opts)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.profile = profile
    return driver


def wait(driver, condition, timeout=60, what="the page"):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(condition))
    except Exception:
        raise SystemExit(f"timed out waiting for {what}: {condition}\n" + console(driver))


def console(driver):
    try:
        return "\n".join(e["message"] for e in driver.get_log("browser"))
    except Exception:
        return ""


def shot(driver, out, name):
    """The whole page (the window stretched to its height for the picture)."""
    path = out / f"{name}.png"
    size = driver.get_window_size()
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(size["width"], max(size["height"], height + 140))
    driver.save_screenshot(str(path))
    driver.set_window_size(size["width"], size["height"])
    print(f"     screenshot {path}")


def cli(binary, cache, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True,
                       env={**os.environ, "PARAKEET_CACHE": str(cache), "GGML_NO_BACKTRACE": "1"})
    if r.returncode != 0:
        raise SystemExit(f"parakeet {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def page_text(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#transcript .w')).map(w => w.textContent).join(' ')")


def drop_file(driver, path):
    driver.execute_script("""
        const [b64, name] = arguments;
        const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, {type: 'audio/wav'}));
        const zone = document.getElementById('drop');
        for (const type of ['dragenter', 'dragover', 'drop']) {
          zone.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
        }
    """, base64.b64encode(path.read_bytes()).decode(), path.name)


def wait_result(driver, what):
    wait(driver, "return (!document.getElementById('result').hidden && document.querySelector('#transcript').textContent.length > 0)"
                 " || !document.getElementById('file-error').hidden", 120, what)


# --- the checks ---------------------------------------------------------------------------

def test_key_and_page(driver, server, out):
    """Without the key: the page says the server refused and asks for it; the socket is refused."""
    driver.get(server.url + "/")
    wait(driver, "return !document.getElementById('key-form').hidden", 20, "the key form")
    said = driver.find_element(By.ID, "server").text
    status, _, body = http(server.url + "/ui/info")
    message = json.loads(body)["error"]["message"]
    check(status == 401 and message in said, f"without the key the page is refused, in the API's words: {said!r}")
    closed = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const ws = new WebSocket('ws://' + location.host + '/v1/realtime', ['realtime']);
        let opened = false;
        ws.onopen = () => { opened = true; };
        ws.onclose = (e) => done({opened, code: e.code});
    """)
    check(not closed["opened"], f"without the key the socket is refused (close code {closed['code']})")
    status, _, _ = http(server.url + "/v1/realtime", {"Connection": "Upgrade", "Upgrade": "websocket",
                                                        "Sec-WebSocket-Version": "13",
                                                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    check(status == 401, f"the socket's handshake without the key: HTTP {status}")
    shot(driver, out, "1-no-key")
    field = driver.find_element(By.ID, "key-input")
    field.send_keys("sk-wrong")
    field.send_keys(Keys.ENTER)
    wait(driver, "return document.getElementById('server').textContent.includes('Incorrect API key')", 20,
         "the wrong key's refusal")
    check(True, "a wrong key is refused in the API's words")
    field = driver.find_element(By.ID, "key-input")
    field.send_keys(KEY)
    field.send_keys(Keys.ENTER)
    wait(driver, "return document.getElementById('server').textContent.startsWith('Model ')", 20, "the server's info")
    said = driver.find_element(By.ID, "server").text
    check("tiny" in said and " on CPU" in said, f"the page names the model and device: {said!r}")
    shot(driver, out, "2-ready")


def test_timing(driver, server):
    """First paint and the page's weight, on a fresh load (the key kept in the session)."""
    driver.get(server.url + "/")
    wait(driver, "return document.getElementById('server').textContent.startsWith('Model ')", 20, "the page")
    # The paint entry is recorded when the frame is presented, which on a busy machine can come
    # after the info request has answered: wait for it rather than read it once.
    deadline = time.time() + 10
    while time.time() < deadline and not driver.execute_script(
            "return performance.getEntriesByType('paint').length > 0"):
        time.sleep(0.05)
    m = driver.execute_script("""
        const nav = performance.getEntriesByType('navigation')[0];
        const paint = performance.getEntriesByType('paint');
        const fcp = paint.find(p => p.name === 'first-contentful-paint') || paint[0];
        const res = performance.getEntriesByType('resource');
        const bytes = nav.encodedBodySize + res.reduce((s, r) => s + r.encodedBodySize, 0);
        const decoded = nav.decodedBodySize + res.reduce((s, r) => s + r.decodedBodySize, 0);
        const others = res.map(r => r.name).filter(n => !n.startsWith(location.origin));
        return {fcp: fcp ? fcp.startTime : null, bytes, decoded, others, files: res.length + 1};
    """)
    fcp = "none recorded" if m["fcp"] is None else f"{m['fcp']:.1f} ms"
    print(f"     first contentful paint {fcp}; page weight {m['bytes']} bytes in {m['files']} files "
          f"(including /ui/info)")
    check(m["fcp"] is not None and m["fcp"] < FIRST_PAINT_MS, f"first paint under {FIRST_PAINT_MS} ms ({fcp})")
    check(m["bytes"] < PAGE_BYTES, f"the page's whole weight under {PAGE_BYTES} bytes ({m['bytes']})")
    check(not m["others"], f"nothing is loaded from elsewhere ({m['others']})")
    return m


def test_file(driver, server, binary, cache, out, downloads, model, diar):
    # A dropped file, default options: the text of `parakeet transcribe`.
    drop_file(driver, CLIP)
    wait_result(driver, "the dropped file's transcript")
    expected = cli(binary, cache, "transcribe", str(CLIP), "-m", str(model)).strip()
    got = page_text(driver)
    check(got == expected, f"a dropped file's transcript equals `parakeet transcribe`'s ({len(expected)} chars)")
    if got != expected:
        print(f"     page: {got!r}\n     cli:  {expected!r}")
    shot(driver, out, "3-file")

    # Clicking a word seeks the audio to its start.
    spans = driver.find_elements(By.CSS_SELECTOR, "#transcript .w")
    target = spans[min(5, len(spans) - 1)]
    start = float(target.get_attribute("title").split(" s")[0])
    driver.execute_script("document.getElementById('player').muted = true")
    target.click()
    t = driver.execute_script("return document.getElementById('player').currentTime")
    check(abs(t - start) < 0.25, f"clicking a word seeks the audio to it ({t:.2f} s, the word at {start:.2f} s)")
    wait(driver, "return !!document.querySelector('#transcript .w.now')", 10, "the word highlighted")
    check(True, "the word being played is highlighted")
    driver.execute_script("document.getElementById('player').pause()")

    # Low-confidence words are marked, as many as the API's words below the threshold.
    status, _, body = post_file(server, CLIP, [("response_format", "verbose_json"),
                                                ("timestamp_granularities[]", "word"),
                                                ("timestamp_granularities[]", "segment")])
    api_words = json.loads(body)["words"]
    low = sum(1 for w in api_words if w.get("probability", 1.0) < 0.6)
    marked = len(driver.find_elements(By.CSS_SELECTOR, "#transcript .w.low"))
    check(marked == low, f"low-confidence words are marked ({marked} of {len(api_words)}, the API's: {low})")
    if diar:
        speakers = sorted({w["speaker"] for w in api_words if "speaker" in w})
        legend = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#speaker-legend li")]
        bars = len(driver.find_elements(By.CSS_SELECTOR, "#speaker-bar div"))
        check(sorted(legend) == [f"Speaker {s}" for s in speakers] and (bars > 0) == bool(speakers),
              f"the speaker timeline shows the API's speakers {speakers} ({bars} turns)")

    # The srt download is the server's srt: the CLI's file.
    for f in downloads.glob("*"):
        f.unlink()
    driver.find_element(By.CSS_SELECTOR, "#downloads button[data-format='srt']").click()
    deadline = time.time() + 60
    while time.time() < deadline and not list(downloads.glob("*.srt")):
        time.sleep(0.1)
    srt_dir = Path(tempfile.mkdtemp())
    cli(binary, cache, "transcribe", str(CLIP), "-m", str(model), "-f", "srt", "-o", str(srt_dir))
    got = list(downloads.glob("*.srt"))
    want = (srt_dir / "speech_10s.srt").read_text()
    check(bool(got) and got[0].read_text() == want, "the srt download equals `parakeet transcribe -f srt`'s file")

    # A picked file with VAD and a boosted phrase: the CLI's text for the same options.
    driver.find_element(By.ID, "opt-vad").click()
    driver.find_element(By.ID, "opt-boost").send_keys("the cat")
    driver.execute_script("document.getElementById('file-error').hidden = true; "
                          "document.getElementById('result').hidden = true;")
    driver.find_element(By.ID, "file-input").send_keys(str(FIXTURES / "audio" / "speech_2s.wav"))
    wait_result(driver, "the picked file's transcript")
    expected = cli(binary, cache, "transcribe", str(FIXTURES / "audio" / "speech_2s.wav"), "-m", str(model),
                   "--vad", "--boost", "the cat").strip()
    got = page_text(driver) or driver.find_element(By.ID, "transcript").text
    check(got == expected, f"a picked file with VAD and a boosted phrase equals `transcribe --vad --boost`'s: {got!r}")
    driver.find_element(By.ID, "opt-vad").click()
    driver.find_element(By.ID, "opt-boost").clear()

    # A file the API refuses: its error, word for word.
    bad = Path(tempfile.mkdtemp()) / "notes.wav"
    bad.write_bytes(b"these are not the samples you are looking for\n" * 4)
    status, _, body = post_file(server, bad, [("response_format", "verbose_json")])
    message = json.loads(body)["error"]["message"]
    driver.find_element(By.ID, "file-input").send_keys(str(bad))
    wait(driver, "return !document.getElementById('file-error').hidden", 60, "the refusal")
    shown = driver.find_element(By.ID, "file-error").text
    check(status == 400 and message in shown, f"a refused file shows the API's error: {shown!r}")
    shot(driver, out, "4-refused")


def post_file(server, path, fields):
    ctype, body = multipart(fields, path.name, path.read_bytes())
    return http(server.url + "/v1/audio/transcriptions", {"Content-Type": ctype, "Authorization": f"Bearer {KEY}"},
                body, "POST")


A11Y_CHECKS = r"""
// Our own checks: every control named, images with alt, text contrast (WCAG AA), the page's
// language and title.
const problems = [];
const visible = (el) => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
  return s.visibility !== 'hidden' && s.display !== 'none' && (r.width > 0 || el.type === 'file') && !el.closest('[hidden]'); };
const name = (el) => {
  if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
  if (el.getAttribute('aria-labelledby')) return el.getAttribute('aria-labelledby').split(' ').map(i => (document.getElementById(i) || {}).textContent || '').join(' ');
  if (el.labels && el.labels.length) return Array.from(el.labels).map(l => l.textContent).join(' ');
  if (el.title) return el.title;
  return el.tagName === 'BUTTON' ? el.textContent : '';
};
for (const el of document.querySelectorAll('button, input, select, textarea, audio, progress, canvas, [role=tab], [tabindex]')) {
  if (!el.closest('[hidden]') && !name(el).trim() && !(el.tagName === 'CANVAS' && el.getAttribute('aria-hidden'))
      && !(el.classList.contains('w') && el.textContent.trim())) problems.push('no name: ' + el.outerHTML.slice(0, 80));
}
for (const img of document.querySelectorAll('img')) if (!img.hasAttribute('alt')) problems.push('img without alt');
if (!document.documentElement.lang) problems.push('no lang');
if (!document.title) problems.push('no title');
const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
const bg = (el) => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
  if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c; } return [255, 255, 255]; };
let checked = 0;
for (const el of document.querySelectorAll('body *')) {
  const own = Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own || !visible(el)) continue;
  const s = getComputedStyle(el);
  const fg = rgb(s.color), back = bg(el);
  const [a, b] = [lum(fg), lum(back)].sort((x, y) => y - x);
  const ratio = (a + 0.05) / (b + 0.05);
  const large = parseFloat(s.fontSize) >= 24 || (parseFloat(s.fontSize) >= 18.66 && +s.fontWeight >= 700);
  checked++;
  if (ratio < (large ? 3 : 4.5)) problems.push(`contrast ${ratio.toFixed(2)}: ${el.tagName} "${el.textContent.trim().slice(0, 30)}"`);
}
return {problems, checked};
"""


def test_accessibility(driver, server, axe):
    # A transcript on the page, so that its words are checked too.
    r = driver.execute_script(A11Y_CHECKS)
    check(not r["problems"], f"controls named, images described, text contrast AA ({r['checked']} texts): {r['problems']}")
    # Keyboard: Tab reaches every control in order, the tabs switch with the arrows, a word
    # seeks with Enter.
    driver.execute_script("document.activeElement.blur(); window.scrollTo(0, 0)")
    body = driver.find_element(By.TAG_NAME, "body")
    body.click()
    reached = []
    for _ in range(40):
        webdriver.ActionChains(driver).send_keys(Keys.TAB).perform()
        el = driver.execute_script("const a = document.activeElement; return a.id || a.className || a.tagName")
        if reached and el == reached[0]:
            break
        reached.append(el)
    want = ["tab-file", "file-input", "opt-words", "opt-vad", "opt-boost", "transcribe", "player", "w"]
    missing = [w for w in want if not any(w == r or (w == "w" and r.startswith("w")) for r in reached)]
    check(not missing, f"Tab reaches every control ({len(reached)} stops; missing {missing})")
    tab = driver.find_element(By.ID, "tab-file")
    tab.send_keys(Keys.ARROW_RIGHT)
    live = driver.execute_script("return document.getElementById('tab-live').getAttribute('aria-selected') === 'true'"
                                 " && !document.getElementById('panel-live').hidden")
    check(live, "the arrow keys switch the tabs")
    driver.find_element(By.ID, "tab-live").send_keys(Keys.ARROW_LEFT)
    word = driver.find_elements(By.CSS_SELECTOR, "#transcript .w")[3]
    driver.execute_script("arguments[0].focus()", word)
    word.send_keys(Keys.ENTER)
    start = float(word.get_attribute("title").split(" s")[0])
    t = driver.execute_script("return document.getElementById('player').currentTime")
    check(abs(t - start) < 0.25, f"Enter on a word seeks to it ({t:.2f} s, the word at {start:.2f} s)")
    driver.execute_script("document.getElementById('player').pause()")
    if axe is None:
        print("     axe-core skipped: not installed (scripts/ci_browser.sh installs it with npm)")
        return
    driver.execute_script(axe.read_text())
    result = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})
          .then(r => done(r.violations.map(v => v.id + ': ' + v.nodes.map(n => n.target.join(' ')).join(', '))),
                e => done(['axe failed: ' + e]));
    """)
    check(not result, f"axe-core (WCAG 2.1 A and AA) finds nothing: {result}")


def sent_audio(driver):
    """The pcm16 the page sent, from the socket frames in the performance log, and its rate."""
    rate, chunks = None, []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] != "Network.webSocketFrameSent":
            continue
        try:
            event = json.loads(msg["params"]["response"]["payloadData"])
        except ValueError:
            continue
        if event.get("type") == "session.update" and "audio" in event["session"]:
            rate = event["session"]["audio"]["input"]["format"]["rate"]
        elif event.get("type") == "input_audio_buffer.append":
            chunks.append(base64.b64decode(event["audio"]))
    return rate, b"".join(chunks)


def clip_samples(path):
    with wave.open(str(path)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        data = w.readframes(w.getnframes())
        return w.getframerate(), [int.from_bytes(data[i:i + 2], "little", signed=True) for i in range(0, len(data), 2)]


def best_correlation(sent, clip):
    """The highest normalised correlation of `clip` with `sent` over every lag where the clip
    starts within the audio sent (by FFT), and that lag."""
    import numpy as np
    a = np.asarray(sent, dtype=np.float64)
    b = np.asarray(clip, dtype=np.float64)
    n = len(a) + len(b)
    size = 1 << (n - 1).bit_length()
    xc = np.fft.irfft(np.fft.rfft(a, size) * np.conj(np.fft.rfft(b, size)), size)[: max(1, len(a) - len(b) // 2)]
    # Each lag's energy of the audio sent under the clip.
    c2 = np.concatenate([[0.0], np.cumsum(a * a)])
    lags = np.arange(len(xc))
    ends = np.minimum(lags + len(b), len(a))
    energy = np.sqrt((c2[ends] - c2[lags]) * float(b @ b)) + 1e-9
    r = xc / energy
    lag = int(np.argmax(r))
    return float(r[lag]), lag


def test_live(binary, cache, model, out, downloads, server):
    # The fake microphone plays the clip, then silence: the VAD ends the turn.
    clip_rate, samples = clip_samples(CLIP)
    mic = Path(tempfile.mkdtemp()) / "mic.wav"
    with wave.open(str(mic), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(clip_rate)
        w.writeframes(b"".join(s.to_bytes(2, "little", signed=True) for s in samples) + b"\0\0" * clip_rate * 2)
    driver = browser(out, downloads, fake_audio=mic)
    try:
        driver.get(server.url + "/")
        driver.execute_script(f"sessionStorage.setItem('parakeet-api-key', '{KEY}')")
        driver.get(server.url + "/")
        wait(driver, "return document.getElementById('server').textContent.startsWith('Model ')", 20, "the page")
        driver.find_element(By.ID, "tab-live").click()
        driver.find_element(By.ID, "mic").click()
        wait(driver, "return document.getElementById('mic').textContent.includes('Stop')", 30, "the microphone")
        wait(driver, "return document.getElementById('speech-state').textContent === 'speech'", 30, "speech")
        check(True, "the page shows the server's speech detection (speech)")
        wait(driver, "return document.querySelectorAll('#captions p').length > 0", 30, "a caption")
        shot(driver, out, "5-live")
        wait(driver, "return window.parakeetPage.finals.length > 0", 60, "a final")
        # The clip is over (10 s) and its turn ended: stop, which commits what is left.
        time.sleep(3)
        driver.find_element(By.ID, "mic").click()
        wait(driver, "return document.getElementById('mic').textContent.includes('Start')", 30, "the stop")
        shot(driver, out, "6-live-done")
        stats = driver.execute_script("return window.parakeetPage")
        page_finals = [f for f in stats["finals"] if f]
        rate, pcm = sent_audio(driver)
    finally:
        driver.quit()
        shutil.rmtree(driver.profile, ignore_errors=True)
    sent = [int.from_bytes(pcm[i:i + 2], "little", signed=True) for i in range(0, len(pcm), 2)]
    print(f"     the page sent {len(sent) / rate:.2f} s of audio at {rate} Hz; {len(page_finals)} finals")
    # The microphone gave the clip (Chromium resampled it to the page's rate).
    if rate == clip_rate:
        # The fake microphone may start before the page listens: 2 s of what was sent, from
        # 0.5 s on, are found in the clip.
        c, lag = best_correlation(samples, sent[rate // 2: rate // 2 + 2 * rate])
        check(c > 0.95, f"the audio sent is the clip (2 s of it correlate {c:.4f} with the clip at {lag / rate:.3f} s)")
    sent_wav = Path(tempfile.mkdtemp()) / "sent.wav"
    with wave.open(str(sent_wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    lines = cli(binary, cache, "stream", str(sent_wav), "-m", str(model), "--format", "jsonl", "--vad",
                *SERVER_VAD).splitlines()
    stream_finals = [e["text"] for e in map(json.loads, lines) if e["type"] == "final" and e["text"]]
    check(page_finals == stream_finals and page_finals,
          f"the live captions' finals equal `parakeet stream --vad`'s on the same audio ({len(stream_finals)} finals)")
    if page_finals != stream_finals:
        print(f"     page:   {page_finals}\n     stream: {stream_finals}")
    delays = stats["captionLatencies"]
    print(f"     captions shown {statistics.median(delays):.1f} ms (median), {max(delays):.1f} ms (max) after "
          f"their {len(delays)} events arrived on the socket")
    check(max(delays) < CAPTION_DELAY_MS, f"live captions within {CAPTION_DELAY_MS} ms of their events")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True, help="screenshots and downloads")
    ap.add_argument("--axe", help="axe.min.js (axe-core), when installed")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    downloads = out / "downloads"
    downloads.mkdir(exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="parakeet-cache-"))
    axe = Path(args.axe) if args.axe and Path(args.axe).exists() else None
    model = FIXTURES / "tiny_tdt.nemo"
    diar = FIXTURES / "tiny_sortformer.nemo"
    binary = str(Path(args.binary).resolve())
    # Converted once, before the timings.
    cli(binary, cache, "transcribe", str(CLIP), "-m", str(model))
    server = Server(binary, cache, ["-m", str(model), "--api-key", KEY, "--diar-model", str(diar)])
    driver = browser(out, downloads)
    try:
        test_key_and_page(driver, server, out)
        test_timing(driver, server)
        test_file(driver, server, binary, cache, out, downloads, model, diar=True)
        drop_file(driver, CLIP)
        wait_result(driver, "the transcript for the accessibility checks")
        test_accessibility(driver, server, axe)
    finally:
        driver.quit()
        shutil.rmtree(driver.profile, ignore_errors=True)
    test_live(binary, cache, model, out, downloads, server)
    server.stop()
    shutil.rmtree(cache, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("every browser check passed")


if __name__ == "__main__":
    main()
