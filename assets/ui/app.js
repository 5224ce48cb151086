// The page of `parakeet serve`: a file transcribed through POST /v1/audio/transcriptions, and
// the microphone streamed through the realtime WebSocket, as any OpenAI client would use them.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'parakeet-api-key';
// A word heard with less confidence than this is marked.
const LOW_CONFIDENCE = 0.6;
const SPEAKER_COLOURS = ['#0b6e4f', '#7a3db8', '#b35900', '#1d4ed8', '#a4161a', '#4f6d00', '#8a5a00', '#006d77'];

// What the page measured, for whoever wants to look (the browser tests read it).
const stats = { captionLatencies: [], finals: [], events: 0 };
window.parakeetPage = stats;

let info = null;

function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || '';
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: 'Bearer ' + key } : {};
}

// The message of an API error body (OpenAI's shape), or the body itself.
function apiMessage(status, body) {
  try {
    const e = JSON.parse(body).error;
    if (e && e.message) return e.message;
  } catch (_) { /* not JSON */ }
  return body ? body : 'HTTP ' + status;
}

function show(el, on) {
  el.hidden = !on;
}

function askForKey(why) {
  $('key-why').textContent = why;
  show($('key-form'), true);
  $('key-input').focus();
}

// --- the server ---------------------------------------------------------------------------

async function loadInfo() {
  let resp;
  try {
    resp = await fetch('/ui/info', { headers: authHeaders() });
  } catch (e) {
    $('server').textContent = 'The server cannot be reached: ' + e.message;
    return;
  }
  const body = await resp.text();
  if (resp.status === 401) {
    $('server').textContent = 'The server refused: ' + apiMessage(401, body);
    askForKey(apiMessage(401, body));
    return;
  }
  if (!resp.ok) {
    $('server').textContent = 'The server refused: ' + apiMessage(resp.status, body);
    return;
  }
  info = JSON.parse(body);
  show($('key-form'), false);
  $('server').textContent = 'Model ' + info.model + ' on ' + info.device + ' · parakeet ' + info.version;
  show($('opt-speakers-row'), info.diarization);
  $('transcribe').disabled = !currentFile;
}

$('key-form').addEventListener('submit', (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY_STORE, $('key-input').value.trim());
  $('key-input').value = '';
  loadInfo();
});

// --- tabs ---------------------------------------------------------------------------------

const tabs = [$('tab-file'), $('tab-live')];
function selectTab(tab) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute('aria-selected', String(on));
    t.tabIndex = on ? 0 : -1;
    show($(t.getAttribute('aria-controls')), on);
  }
  tab.focus();
}
for (const t of tabs) {
  t.addEventListener('click', () => selectTab(t));
  t.addEventListener('keydown', (e) => {
    const i = tabs.indexOf(t);
    if (e.key === 'ArrowRight' || e.key === 'ArrowLeft') {
      e.preventDefault();
      selectTab(tabs[(i + (e.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length]);
    }
  });
}

// --- a file -------------------------------------------------------------------------------

let currentFile = null;
let words = [];
let lastJson = null;

function pickFile(file) {
  if (!file) return;
  currentFile = file;
  $('file-name').textContent = file.name + ' (' + (file.size / 1048576).toFixed(1) + ' MiB)';
  $('transcribe').disabled = false;
  transcribeFile();
}

$('file-input').addEventListener('change', (e) => pickFile(e.target.files[0]));
const drop = $('drop');
drop.addEventListener('dragover', (e) => {
  e.preventDefault();
  drop.classList.add('over');
});
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (e) => {
  e.preventDefault();
  drop.classList.remove('over');
  pickFile(e.dataTransfer.files[0]);
});
$('transcribe').addEventListener('click', () => transcribeFile());

// The form of one request: the file and the options chosen, in `format`.
function requestForm(format) {
  const form = new FormData();
  form.append('file', currentFile, currentFile.name);
  form.append('response_format', format);
  if (format === 'verbose_json' && $('opt-words').checked) {
    form.append('timestamp_granularities[]', 'word');
    form.append('timestamp_granularities[]', 'segment');
  }
  if ($('opt-vad').checked) form.append('vad', 'true');
  for (const line of $('opt-boost').value.split('\n')) {
    if (line.trim()) form.append('boost', line.trim());
  }
  return form;
}

// POSTs `form`, reporting the upload's progress, then the wait; resolves to [status, body].
function post(form, what) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    const bar = $('progress');
    show($('file-progress'), true);
    bar.value = 0;
    xhr.open('POST', '/v1/audio/transcriptions');
    for (const [k, v] of Object.entries(authHeaders())) xhr.setRequestHeader(k, v);
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) {
        bar.value = e.loaded / e.total;
        status('Uploading ' + what + ': ' + Math.round(100 * e.loaded / e.total) + ' %');
      }
    };
    xhr.upload.onload = () => {
      bar.removeAttribute('value');
      status('Transcribing ' + what + '…');
    };
    xhr.onload = () => {
      show($('file-progress'), false);
      resolve([xhr.status, xhr.responseText]);
    };
    xhr.onerror = () => {
      show($('file-progress'), false);
      resolve([0, 'the connection to the server failed']);
    };
    xhr.send(form);
  });
}

function status(text) {
  $('file-status').textContent = text;
}

function fileError(text) {
  const el = $('file-error');
  el.textContent = text;
  show(el, !!text);
}

async function transcribeFile() {
  if (!currentFile) return;
  fileError('');
  show($('result'), false);
  $('transcribe').disabled = true;
  const started = performance.now();
  const format = 'verbose_json';
  const [code, body] = await post(requestForm(format), currentFile.name);
  $('transcribe').disabled = false;
  if (code !== 200) {
    status('');
    if (code === 401) askForKey(apiMessage(code, body));
    fileError('The server refused ' + currentFile.name + ' (HTTP ' + code + '): ' + apiMessage(code, body));
    return;
  }
  lastJson = body;
  const result = JSON.parse(body);
  const secs = ((performance.now() - started) / 1000).toFixed(1);
  status(result.duration.toFixed(1) + ' s of audio transcribed in ' + secs + ' s.');
  showResult(result);
}

function showResult(result) {
  const player = $('player');
  if (player.src) URL.revokeObjectURL(player.src);
  player.src = URL.createObjectURL(currentFile);
  words = result.words || [];
  const box = $('transcript');
  box.textContent = '';
  show($('result'), true);
  if (!words.length) {
    box.textContent = result.text;
  } else {
    renderWords(box, $('opt-speakers').checked && info && info.diarization);
  }
  show($('legend'), words.length > 0);
  drawWave(result.duration);
}

function speakerColour(label) {
  const i = label.charCodeAt(0) - 65;
  return SPEAKER_COLOURS[((i % SPEAKER_COLOURS.length) + SPEAKER_COLOURS.length) % SPEAKER_COLOURS.length];
}

function renderWords(box, speakers) {
  let para = null;
  let who = null;
  words.forEach((w, i) => {
    const speaker = speakers ? w.speaker || '' : '';
    if (!para || speaker !== who) {
      para = document.createElement('p');
      para.className = 'turn';
      if (speaker) {
        const tag = document.createElement('span');
        tag.className = 'who';
        tag.textContent = 'Speaker ' + speaker + ':';
        para.appendChild(tag);
      }
      box.appendChild(para);
      who = speaker;
    } else {
      para.appendChild(document.createTextNode(' '));
    }
    const span = document.createElement('span');
    span.className = 'w';
    span.textContent = w.word;
    span.dataset.i = i;
    span.tabIndex = i === 0 ? 0 : -1;
    let title = w.start.toFixed(2) + ' s';
    if (typeof w.probability === 'number') {
      title += ', confidence ' + w.probability.toFixed(2);
      if (w.probability < LOW_CONFIDENCE) span.classList.add('low');
    }
    span.title = title;
    para.appendChild(span);
  });
  const timeline = speakerRuns(speakers);
  drawSpeakers(timeline);
}

// The speakers' turns: runs of consecutive words of one speaker.
function speakerRuns(speakers) {
  const runs = [];
  if (!speakers) return runs;
  for (const w of words) {
    if (!w.speaker) continue;
    const last = runs[runs.length - 1];
    if (last && last.speaker === w.speaker) last.end = w.end;
    else runs.push({ speaker: w.speaker, start: w.start, end: w.end });
  }
  return runs;
}

function drawSpeakers(runs) {
  const bar = $('speaker-bar');
  const legend = $('speaker-legend');
  bar.textContent = '';
  legend.textContent = '';
  show(bar, runs.length > 0);
  show(legend, runs.length > 0);
  const total = waveDuration || (words.length ? words[words.length - 1].end : 1);
  const seen = new Set();
  for (const r of runs) {
    const d = document.createElement('div');
    d.style.left = (100 * r.start / total) + '%';
    d.style.width = Math.max(0.3, 100 * (r.end - r.start) / total) + '%';
    d.style.background = speakerColour(r.speaker);
    d.title = 'Speaker ' + r.speaker + ', ' + r.start.toFixed(1) + '–' + r.end.toFixed(1) + ' s';
    bar.appendChild(d);
    if (!seen.has(r.speaker)) {
      seen.add(r.speaker);
      const li = document.createElement('li');
      const sw = document.createElement('span');
      sw.style.background = speakerColour(r.speaker);
      li.appendChild(sw);
      li.appendChild(document.createTextNode('Speaker ' + r.speaker));
      legend.appendChild(li);
    }
  }
}

// Seeking: a click or Enter on a word, arrows move between words.
$('transcript').addEventListener('click', (e) => {
  const span = e.target.closest('.w');
  if (span) seekTo(+span.dataset.i);
});
$('transcript').addEventListener('keydown', (e) => {
  const span = e.target.closest('.w');
  if (!span) return;
  const i = +span.dataset.i;
  if (e.key === 'Enter' || e.key === ' ') {
    e.preventDefault();
    seekTo(i);
  } else if (e.key === 'ArrowRight' || e.key === 'ArrowLeft') {
    e.preventDefault();
    focusWord(i + (e.key === 'ArrowRight' ? 1 : -1));
  }
});

function wordSpan(i) {
  return $('transcript').querySelector('.w[data-i="' + i + '"]');
}

function focusWord(i) {
  const next = wordSpan(i);
  if (!next) return;
  for (const s of $('transcript').querySelectorAll('.w[tabindex="0"]')) s.tabIndex = -1;
  next.tabIndex = 0;
  next.focus();
}

function seekTo(i) {
  const player = $('player');
  player.currentTime = words[i].start;
  highlight();
  if (player.paused) player.play().catch(() => {});
}

let current = -1;
function highlight() {
  const t = $('player').currentTime;
  // The last word starting at or before t, while t is within it.
  let lo = 0;
  let hi = words.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (words[mid].start <= t) lo = mid + 1;
    else hi = mid;
  }
  const i = lo - 1 >= 0 && t < words[lo - 1].end + 0.05 ? lo - 1 : -1;
  if (i !== current) {
    const old = wordSpan(current);
    if (old) old.classList.remove('now');
    const now = wordSpan(i);
    if (now) now.classList.add('now');
    current = i;
  }
  drawCursor(t);
}

function tick() {
  highlight();
  if (!$('player').paused) requestAnimationFrame(tick);
}
$('player').addEventListener('play', () => requestAnimationFrame(tick));
$('player').addEventListener('seeked', highlight);

// --- the waveform -------------------------------------------------------------------------

let peaks = null;
let waveDuration = 0;

async function drawWave(duration) {
  waveDuration = duration;
  peaks = null;
  const canvas = $('wave');
  canvas.width = canvas.clientWidth * (window.devicePixelRatio || 1);
  try {
    const ctx = new OfflineAudioContext(1, 1, 8000);
    const audio = await ctx.decodeAudioData(await currentFile.arrayBuffer());
    const data = audio.getChannelData(0);
    const n = canvas.width;
    peaks = new Float32Array(2 * n);
    const per = Math.max(1, Math.floor(data.length / n));
    for (let x = 0; x < n; x++) {
      let lo = 0;
      let hi = 0;
      for (let i = x * per; i < Math.min(data.length, (x + 1) * per); i++) {
        if (data[i] < lo) lo = data[i];
        if (data[i] > hi) hi = data[i];
      }
      peaks[2 * x] = lo;
      peaks[2 * x + 1] = hi;
    }
    waveDuration = audio.duration;
  } catch (_) {
    // A format this browser cannot decode: the transcript stands without its waveform.
  }
  drawCursor($('player').currentTime || 0);
}

function drawCursor(t) {
  const canvas = $('wave');
  const g = canvas.getContext('2d');
  const w = canvas.width;
  const h = canvas.height;
  g.clearRect(0, 0, w, h);
  if (peaks) {
    const played = waveDuration ? (t / waveDuration) * w : 0;
    for (let x = 0; x < w; x++) {
      g.fillStyle = x < played ? '#0b6e4f' : '#6b6b6b';
      const y0 = (1 - peaks[2 * x + 1]) * h / 2;
      const y1 = (1 - peaks[2 * x]) * h / 2;
      g.fillRect(x, y0, 1, Math.max(1, y1 - y0));
    }
  }
}

$('wave').addEventListener('click', (e) => {
  const r = e.target.getBoundingClientRect();
  if (waveDuration) {
    $('player').currentTime = ((e.clientX - r.left) / r.width) * waveDuration;
  }
});

// --- downloads: the server's own rendering of each format ---------------------------------

$('downloads').addEventListener('click', async (e) => {
  const button = e.target.closest('button');
  if (!button || !currentFile) return;
  const format = button.dataset.format;
  const ext = { text: 'txt', srt: 'srt', vtt: 'vtt', verbose_json: 'json' }[format];
  let body = lastJson;
  if (format !== 'verbose_json') {
    const [code, text] = await post(requestForm(format), currentFile.name + ' as ' + ext);
    if (code !== 200) {
      fileError('The server refused ' + currentFile.name + ' (HTTP ' + code + '): ' + apiMessage(code, text));
      return;
    }
    status('');
    body = text;
  }
  const a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob([body], { type: 'text/plain' }));
  a.download = currentFile.name.replace(/\.[^.]*$/, '') + '.' + ext;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
});

// --- live ---------------------------------------------------------------------------------

let live = null;

function liveStatus(text) {
  $('live-status').textContent = text;
}

function liveError(text) {
  const el = $('live-error');
  el.textContent = text;
  show(el, !!text);
}

function speechState(text, speaking) {
  const el = $('speech-state');
  el.textContent = text;
  el.classList.toggle('speech', speaking);
}

$('mic').addEventListener('click', () => (live ? stopLive() : startLive()));

async function startLive() {
  liveError('');
  const button = $('mic');
  button.disabled = true;
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
  } catch (e) {
    button.disabled = false;
    liveError('The microphone is not available: ' + e.message);
    return;
  }
  // 16 kHz, the model's rate, where the browser resamples the microphone; else its own rate
  // (the server resamples).
  let ctx;
  let source;
  try {
    ctx = new AudioContext({ sampleRate: 16000 });
    source = ctx.createMediaStreamSource(stream);
  } catch (_) {
    if (ctx) ctx.close();
    ctx = new AudioContext();
    source = ctx.createMediaStreamSource(stream);
  }
  const rate = ctx.sampleRate;
  await ctx.audioWorklet.addModule('/ui/capture.js');
  const node = new AudioWorkletNode(ctx, 'pcm-capture');
  const protocols = ['realtime'];
  if (apiKey()) protocols.push('openai-insecure-api-key.' + apiKey());
  const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
  const ws = new WebSocket(scheme + location.host + '/v1/realtime', protocols);
  live = { ws, ctx, stream, node, items: new Map(), opened: false, stopping: false };
  node.port.onmessage = (e) => {
    if (e.data instanceof ArrayBuffer) sendAudio(ws, e.data);
    else if (e.data.flushed && live && live.onFlushed) live.onFlushed();
  };
  ws.onopen = () => {
    live.opened = true;
    const vad = $('live-vad').checked;
    ws.send(JSON.stringify({
      type: 'session.update',
      session: {
        type: 'transcription',
        audio: { input: { format: { type: 'audio/pcm', rate }, turn_detection: vad ? { type: 'server_vad' } : null } },
      },
    }));
    source.connect(node);
    button.textContent = 'Stop the microphone';
    button.disabled = false;
    liveStatus('Listening (' + (vad ? 'turns end at pauses' : 'one utterance until you stop') + ').');
    speechState(vad ? 'silence' : '—', false);
  };
  ws.onmessage = (e) => onLiveEvent(e.data);
  ws.onclose = (e) => {
    if (live && !live.opened && !live.stopping) {
      liveError('The server refused the live connection' + (e.reason ? ': ' + e.reason : '') +
        (apiKey() ? '.' : ' (this server may require an API key).'));
    }
    teardown();
  };
}

function sendAudio(ws, buffer) {
  if (ws.readyState !== WebSocket.OPEN) return;
  const bytes = new Uint8Array(buffer);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  ws.send(JSON.stringify({ type: 'input_audio_buffer.append', audio: btoa(bin) }));
}

function captionFor(id) {
  let p = live.items.get(id);
  if (!p) {
    p = document.createElement('p');
    p.className = 'partial';
    $('captions').appendChild(p);
    live.items.set(id, p);
  }
  return p;
}

function onLiveEvent(data) {
  const arrived = performance.now();
  if (!live) return;
  const e = JSON.parse(data);
  stats.events++;
  let shown = false;
  switch (e.type) {
    case 'conversation.item.input_audio_transcription.delta': {
      const p = captionFor(e.item_id);
      p.textContent += e.delta;
      shown = true;
      break;
    }
    case 'conversation.item.input_audio_transcription.completed': {
      const p = captionFor(e.item_id);
      p.className = 'final';
      p.textContent = (e.speaker ? 'Speaker ' + e.speaker + ': ' : '') + e.transcript;
      if (!e.transcript) p.remove();
      stats.finals.push(e.transcript);
      shown = true;
      break;
    }
    case 'session.updated':
      if (live.stopping && live.onUpdated) live.onUpdated();
      break;
    case 'input_audio_buffer.speech_started':
      speechState('speech', true);
      shown = true;
      break;
    case 'input_audio_buffer.speech_stopped':
      speechState('silence', false);
      shown = true;
      break;
    case 'error':
      // Stopping commits what is left; an empty buffer (a turn just ended) is no error.
      if (!(live.stopping && e.error.code === 'input_audio_buffer_commit_empty')) {
        liveError('The server: ' + e.error.message);
      }
      break;
    default:
      break;
  }
  if (shown) {
    // From the event's arrival to the frame that shows it.
    requestAnimationFrame(() => stats.captionLatencies.push(performance.now() - arrived));
  }
}

async function stopLive() {
  if (!live || live.stopping) return;
  const l = live;
  l.stopping = true;
  $('mic').disabled = true;
  liveStatus('Finishing…');
  // The audio still in the capture block goes out, then the commit ends the utterance.
  await new Promise((resolve) => {
    l.onFlushed = resolve;
    l.node.port.postMessage('flush');
    setTimeout(resolve, 1000);
  });
  l.stream.getTracks().forEach((t) => t.stop());
  l.node.disconnect();
  if (l.ws.readyState === WebSocket.OPEN) {
    // The server answers events in order: once this session.update is answered, every event
    // of the commit has come.
    await new Promise((resolve) => {
      l.onUpdated = resolve;
      l.ws.send(JSON.stringify({ type: 'input_audio_buffer.commit' }));
      l.ws.send(JSON.stringify({ type: 'session.update', session: {} }));
      setTimeout(resolve, 10000);
    });
    l.ws.close(1000, 'done');
  }
  teardown();
}

function teardown() {
  if (!live) return;
  const l = live;
  live = null;
  l.stream.getTracks().forEach((t) => t.stop());
  l.ctx.close().catch(() => {});
  const button = $('mic');
  button.textContent = 'Start the microphone';
  button.disabled = false;
  liveStatus('Stopped.');
  speechState('—', false);
}

loadInfo();
