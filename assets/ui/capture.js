// The microphone's samples as 16-bit PCM, in blocks of about 100 ms, posted to the page. Runs
// on the audio thread (an AudioWorklet): the page's own thread never holds the audio back.
class PcmCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Int16Array(Math.round(sampleRate / 10));
    this.filled = 0;
    this.port.onmessage = (e) => {
      if (e.data === 'flush') {
        this.post();
        this.port.postMessage({ flushed: true });
      }
    };
  }

  post() {
    if (this.filled > 0) {
      const out = this.block.slice(0, this.filled);
      this.port.postMessage(out.buffer, [out.buffer]);
      this.filled = 0;
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        // As the WAV reader reads: x * 32768, rounded and clamped to pcm16.
        const v = Math.round(channel[i] * 32768);
        this.block[this.filled++] = v > 32767 ? 32767 : v < -32768 ? -32768 : v;
        if (this.filled === this.block.length) this.post();
      }
    }
    return true;
  }
}

registerProcessor('pcm-capture', PcmCapture);
