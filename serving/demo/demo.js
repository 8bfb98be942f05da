// The demo page of `mindvl serve`: a client of the server's own REST endpoints (no framework, no build step).
//   GET  /demo/settings                      the largest request body and image side, the cascade (or null)
//   GET  /servables                          the servables and their loaded versions' methods
//   POST /model/<s>/version/<n>:predict      a classifier's answer and confidence
//   POST /model/<s>/version/<n>:generate     a generative answer, streamed as Server-Sent Events, with the
//                                            conversation so far as `history`
//   POST /cascade                            the edge-cloud cascade's answer and who gave it
// A spoken question is recorded from the microphone, trimmed of its silent ends and encoded here as 16-bit WAV.
"use strict";

const RECORD_LIMIT_S = 15;       // a recording stops by itself after this long
const SILENCE_RMS = 0.01;        // a 20 ms window quieter than this (and than 5% of the loudest) is silence
const KEEP_AROUND_S = 0.1;       // silence kept before and after the speech

const $ = (id) => document.getElementById(id);
// conversation: a generative model's earlier exchanges about the chosen image, sent as `history` with each question
const page = { settings: null, servables: {}, image: null, recording: null, recorder: null, conversation: [] };

// ---- small helpers ---------------------------------------------------------------------------------

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function megabytes(bytes) {
  return bytes < 1048576 ? `${Math.ceil(bytes / 1024)} KB` : `${(bytes / 1048576).toFixed(1)} MB`;
}

function percent(value) {
  return Number.isFinite(value) ? (100 * value).toFixed(1) + "%" : "-";
}

function base64(bytes) {
  const array = new Uint8Array(bytes);
  let text = "";
  for (let i = 0; i < array.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, array.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

async function getJson(url) {
  let response;
  try {
    response = await fetch(url, { headers: { Accept: "application/json" } });
  } catch (error) {
    throw new Error(`The server did not answer ${url} (${error.message}); is mindvl serve still running?`);
  }
  return readJson(response);
}

async function readJson(response) {
  if (response.status === 413) {
    throw new Error("The server refused the request as too large (413): pick a smaller image or record a " +
                    "shorter question.");
  }
  let body;
  try {
    body = await response.json();
  } catch (error) {
    throw new Error(`The server answered HTTP ${response.status} without JSON; check the server's log.`);
  }
  if (body && typeof body.error_msg === "string") {
    throw new Error(`The server refused the question: ${body.error_msg}`);
  }
  if (body && body.error && typeof body.error.message === "string") {
    throw new Error(`The server refused the question: ${body.error.message}`);
  }
  return body;
}

async function postJson(url, payload, accept) {
  try {
    return await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: accept || "application/json" },
      body: payload,
    });
  } catch (error) {
    throw new Error(`The server did not answer (${error.message}); is mindvl serve still running?`);
  }
}

// ---- servables ---------------------------------------------------------------------------------------

function kindOf(methods) {
  if (methods.includes("generate")) return "generate";
  if (methods.includes("predict")) return "predict";
  return null;
}

async function loadServables() {
  const listing = await getJson("/servables");
  page.servables = {};
  for (const [name, entry] of Object.entries(listing.servables || {})) {
    const versions = Object.entries(entry.versions)
      .filter(([, v]) => v.status === "loaded" && kindOf(v.methods))
      .map(([number, v]) => ({ number: Number(number), kind: kindOf(v.methods) }));
    if (versions.length) page.servables[name] = { versions, newest: entry.default_version };
  }
  const select = $("servable");
  select.replaceChildren();
  for (const name of Object.keys(page.servables).sort()) select.add(new Option(name, name));
  if (!select.options.length) {
    showError("No servable that answers questions is loaded yet; deploy a package with `mindvl deploy PKG " +
              "--servable-dir DIR --name NAME` and reload this page.");
  }
  servableChanged();
}

function servableChanged() {
  const entry = page.servables[$("servable").value];
  const select = $("version");
  select.replaceChildren();
  if (!entry) return modelChanged();
  select.add(new Option(`newest (${entry.newest})`, "0"));
  for (const v of entry.versions.slice().sort((a, b) => b.number - a.number)) {
    select.add(new Option(String(v.number), String(v.number)));
  }
  modelChanged();
}

function chosen() {
  const name = $("servable").value;
  const entry = page.servables[name];
  if (!entry) return null;
  const asked = Number($("version").value || 0);
  const number = asked || entry.newest;
  const version = entry.versions.find((v) => v.number === number) || entry.versions[0];
  const cascade = page.settings && page.settings.cascade;
  const route = document.querySelector('input[name="route"]:checked').value;
  const viaCascade = route === "cascade" && cascade && cascade.servable === name;
  return { name, asked, number: version.number, kind: viaCascade ? cascade.method : version.kind, viaCascade };
}

function modelChanged() {
  newConversation();
  const cascade = page.settings && page.settings.cascade;
  const name = $("servable").value;
  $("route-group").hidden = !(cascade && cascade.servable === name);
  const model = chosen();
  if (!model) {
    $("model-kind").textContent = "";
    return;
  }
  $("model-kind").textContent = model.kind === "generate"
    ? "A generative model: it answers in words, streamed as they come."
    : "A classifier: it answers with one of its labels and how sure it is.";
  $("generation-settings").hidden = model.kind !== "generate";
}

// ---- the image --------------------------------------------------------------------------------------

function requestLimit() {
  return page.settings ? page.settings.max_request_mb * 1048576 : Infinity;
}

async function takeImage(file) {
  clearError();
  newConversation();
  page.image = null;
  $("preview").hidden = true;
  $("image-hint").textContent = "";
  if (!file) return;
  if (!["image/png", "image/jpeg"].includes(file.type)) {
    showError(`${file.name} is not a PNG or JPEG image (it is ${file.type || "of an unknown type"}); choose one that is.`);
    return;
  }
  // base64 makes the body 4/3 of the file's size
  if (file.size * 4 / 3 > requestLimit()) {
    showError(`The image is too large: ${file.name} is ${megabytes(file.size)} and this server takes requests up ` +
              `to ${page.settings.max_request_mb} MB (its --max-request-mb), about ` +
              `${megabytes(requestLimit() * 3 / 4)} of image; choose a smaller or more compressed image.`);
    return;
  }
  const url = URL.createObjectURL(file);
  const preview = $("preview");
  try {
    await new Promise((resolve, reject) => {
      preview.onload = resolve;
      preview.onerror = () => reject(new Error(`${file.name} cannot be decoded as an image; choose another file.`));
      preview.src = url;
    });
  } catch (error) {
    showError(error.message);
    return;
  }
  const side = page.settings ? page.settings.max_image_side : Infinity;
  if (preview.naturalWidth > side || preview.naturalHeight > side) {
    showError(`The image is too large: ${preview.naturalWidth}x${preview.naturalHeight} pixels, and the server ` +
              `takes images up to ${side}x${side}; scale it down first.`);
    return;
  }
  preview.alt = `The chosen image, ${file.name}`;
  preview.hidden = false;
  $("image-hint").textContent = `${file.name}, ${preview.naturalWidth}x${preview.naturalHeight}, ${megabytes(file.size)}`;
  page.image = await file.arrayBuffer();
}

function bindDrop() {
  const zone = $("image-group");
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("dragging");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("dragging");
    const file = event.dataTransfer.files[0];
    if (file) {
      $("image").value = "";
      takeImage(file);
    }
  });
  $("image").addEventListener("change", (event) => takeImage(event.target.files[0]));
}

// ---- the spoken question --------------------------------------------------------------------------

async function startRecording() {
  clearError();
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    showError("This browser offers no microphone to this page: recording needs https or http://localhost. " +
              "Type the question instead.");
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  } catch (error) {
    if (error.name === "NotAllowedError" || error.name === "SecurityError") {
      showError("Microphone permission was denied: allow the microphone for this page in the browser's site " +
                "settings and record again, or type the question.");
    } else if (error.name === "NotFoundError") {
      showError("No microphone was found: connect one and record again, or type the question.");
    } else {
      showError(`The microphone could not be opened (${error.name}: ${error.message}); type the question instead.`);
    }
    return;
  }
  const context = new AudioContext();
  const source = context.createMediaStreamSource(stream);
  // ScriptProcessorNode is deprecated for AudioWorklet, but needs no second file and runs in every browser
  const processor = context.createScriptProcessor(4096, 1, 1);
  const chunks = [];
  processor.onaudioprocess = (event) => chunks.push(new Float32Array(event.inputBuffer.getChannelData(0)));
  source.connect(processor);
  processor.connect(context.destination);
  page.recorder = { stream, context, source, processor, chunks, timer: setTimeout(stopRecording, RECORD_LIMIT_S * 1000) };
  $("record").textContent = "Stop recording";
  $("record").setAttribute("aria-pressed", "true");
  $("record-status").textContent = `Recording (it stops by itself after ${RECORD_LIMIT_S} s)...`;
}

function stopRecording() {
  const recorder = page.recorder;
  if (!recorder) return;
  page.recorder = null;
  clearTimeout(recorder.timer);
  recorder.source.disconnect();
  recorder.processor.disconnect();
  recorder.stream.getTracks().forEach((track) => track.stop());
  const rate = recorder.context.sampleRate;
  recorder.context.close();
  $("record").textContent = "Record a question";
  $("record").setAttribute("aria-pressed", "false");
  const samples = trimSilence(concatenate(recorder.chunks), rate);
  if (!samples.length) {
    $("record-status").textContent = "";
    showError("The recording is silent: check the microphone and record again, or type the question.");
    return;
  }
  setRecording(encodeWav(samples, rate), samples.length / rate);
}

function setRecording(wav, seconds) {
  page.recording = wav;
  const playback = $("playback");
  if (playback.src) URL.revokeObjectURL(playback.src);
  if (wav) {
    playback.src = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    $("record-status").textContent = `Recorded ${seconds.toFixed(1)} s of speech; it is sent with the question.`;
  } else {
    playback.removeAttribute("src");
    $("record-status").textContent = "";
  }
  playback.hidden = !wav;
  $("clear-recording").hidden = !wav;
}

function concatenate(chunks) {
  const out = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

function trimSilence(samples, rate) {
  const window = Math.max(1, Math.round(rate * 0.02));
  const loudness = [];
  for (let start = 0; start < samples.length; start += window) {
    let sum = 0;
    const end = Math.min(samples.length, start + window);
    for (let i = start; i < end; i++) sum += samples[i] * samples[i];
    loudness.push(Math.sqrt(sum / (end - start)));
  }
  const threshold = Math.max(SILENCE_RMS, 0.05 * Math.max(0, ...loudness));
  const first = loudness.findIndex((value) => value >= threshold);
  if (first < 0) return new Float32Array(0);
  let last = loudness.length - 1;
  while (loudness[last] < threshold) last--;
  const keep = Math.round(KEEP_AROUND_S * rate);
  return samples.slice(Math.max(0, first * window - keep), Math.min(samples.length, (last + 1) * window + keep));
}

function encodeWav(samples, rate) {
  const buffer = new ArrayBuffer(44 + 2 * samples.length);
  const view = new DataView(buffer);
  const text = (at, value) => [...value].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + 2 * samples.length, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true);       // the fmt chunk's size
  view.setUint16(20, 1, true);        // PCM
  view.setUint16(22, 1, true);        // mono
  view.setUint32(24, rate, true);
  view.setUint32(28, 2 * rate, true); // bytes per second
  view.setUint16(32, 2, true);        // bytes per frame
  view.setUint16(34, 16, true);       // bits per sample
  text(36, "data");
  view.setUint32(40, 2 * samples.length, true);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(44 + 2 * i, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  return buffer;
}

// ---- asking -------------------------------------------------------------------------------------------

function resetAnswer(model) {
  $("answer").textContent = "";
  $("answer").dataset.state = "waiting";
  $("answer").dataset.tokens = "0";
  $("confidence").textContent = "-";
  $("source").textContent = "-";
  $("source").className = "";
  $("generated").textContent = "-";
  $("generated-label").textContent = model.viaCascade ? "Edge's answer" : "Generated text";
  $("generated").hidden = $("generated-label").hidden = model.kind === "generate" && !model.viaCascade;
  $("elapsed").textContent = "-";
  $("answered-model").textContent = `${model.name}, version ${model.number}` +
    (model.viaCascade ? ` (cloud of the cascade; edge package ${page.settings.cascade.edge})` : "");
}

function showSource(source) {
  const words = { server: "this server's servable", edge: "the edge (on this machine, as a device would)",
                  cloud: "the cloud (this server's servable)", edge_fallback: "the edge, because the cloud failed" };
  $("source").textContent = words[source] || source;
  $("source").className = `source-${source}`;
}

// ---- the conversation ----------------------------------------------------------------------------------
// A generative model (asked directly, not through the cascade) reads the whole conversation: each question goes
// with the earlier exchanges about the same image as `history` (the image placed in the first turn, as the model
// takes one per conversation). A spoken question is shown but not replayed (the model takes one clip per
// conversation: the new question's). A new image or model starts a new conversation; the server leaves the
// oldest exchanges out when they no longer fit, and the page says so.

function newConversation() {
  page.conversation = [];
  showConversation(0);
}

function historyFor(model) {
  if (model.kind !== "generate" || model.viaCascade) return null;
  const turns = [];
  for (const exchange of page.conversation.filter((e) => e.typed)) {
    const parts = turns.length ? [] : [{ type: "image" }];
    turns.push({ role: "user", content: parts.concat([{ type: "text", text: exchange.question }]) });
    turns.push({ role: "assistant", content: exchange.answer });
  }
  return turns.length ? turns : null;
}

function remember(model, question, spoken, answer) {
  if (model.kind !== "generate" || model.viaCascade) return;
  page.conversation.push({ question: question || "(a spoken question)", typed: Boolean(question) && !spoken, answer });
}

function showConversation(dropped) {
  const list = $("conversation");
  list.replaceChildren();
  for (const exchange of page.conversation) {
    const item = document.createElement("li");
    const asked = document.createElement("p");
    asked.className = "asked";
    asked.textContent = exchange.question + (exchange.typed ? "" : " (spoken: not replayed to the model)");
    const said = document.createElement("p");
    said.className = "said";
    said.textContent = exchange.answer;
    item.append(asked, said);
    list.append(item);
  }
  $("conversation-section").hidden = !page.conversation.length;
  $("conversation-note").textContent = dropped
    ? `The ${dropped} oldest turn(s) no longer fit the model's prompt and were left out of the last question.`
    : "";
}

function instanceFor(model) {
  const question = $("question").value.trim();
  const audio = page.recording ? { b64: base64(page.recording) } : null;
  const instance = { image: { b64: base64(page.image) } };
  if (model.kind === "generate") {
    if (question) instance.text = question;
    if (audio) instance.audio = audio;
    const history = historyFor(model);
    if (history) instance.history = JSON.stringify(history);
    const tokens = Number($("max-tokens").value);
    if (Number.isInteger(tokens) && tokens > 0) instance.max_tokens = tokens;
  } else {
    instance.question = question;
    instance.audio = audio || { b64: "" };
  }
  return instance;
}

async function ask(event) {
  event.preventDefault();
  clearError();
  if (page.recorder) stopRecording();
  const model = chosen();
  if (!model) return showError("There is no servable to ask; deploy one and reload the page.");
  if (!page.image) return showError("Choose an image first (PNG or JPEG).");
  if (!$("question").value.trim() && !page.recording) return showError("Type a question or record one.");
  const instance = instanceFor(model);
  const body = JSON.stringify({ instances: [instance] });
  if (body.length > requestLimit()) {
    return showError(`The question is too large to send: ${megabytes(body.length)} with its image and recording, ` +
                     `over this server's ${page.settings.max_request_mb} MB (--max-request-mb); choose a smaller ` +
                     `image or record a shorter question.`);
  }
  const button = $("ask");
  button.disabled = true;
  resetAnswer(model);
  const started = performance.now();
  try {
    if (model.viaCascade) await askCascade(model, body);
    else if (model.kind === "generate") {
      const dropped = await streamGenerate(model, body);
      remember(model, $("question").value.trim(), Boolean(instance.audio), $("answer").textContent);
      showConversation(dropped);
    } else await predict(model, body);
    $("answer").dataset.state = "done";
  } catch (error) {
    $("answer").dataset.state = "error";
    showError(error.message);
  } finally {
    $("elapsed").textContent = `${((performance.now() - started) / 1000).toFixed(2)} s`;
    button.disabled = false;
  }
}

function url(model, method) {
  return `/model/${encodeURIComponent(model.name)}/version/${model.asked}:${method}`;
}

async function predict(model, body) {
  const reply = await readJson(await postJson(url(model, "predict"), body));
  const result = reply.instances[0];
  if (result.error_msg) throw new Error(`The server could not answer: ${result.error_msg}`);
  $("answer").textContent = result.answer;
  $("confidence").textContent = percent(result.confidence);
  $("generated").textContent = result.answer_text || "-";
  showSource("server");
}

async function streamGenerate(model, body) {
  const response = await postJson(url(model, "generate"), body, "text/event-stream");
  if (!(response.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
    await readJson(response);  // an error reply: throws its message
    throw new Error(`The server answered HTTP ${response.status} without a stream; check the server's log.`);
  }
  $("answer").dataset.state = "streaming";
  showSource("server");
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const logprobs = [];
  let buffer = "";
  let text = "";
  let dropped = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return dropped;
        const delta = JSON.parse(data);
        if (delta.error) throw new Error(`The generation failed: ${delta.error.message}`);
        if (delta.dropped_turns) dropped = delta.dropped_turns;
        text += delta.text;
        logprobs.push(delta.logprob);
        $("answer").textContent = text;
        $("answer").dataset.tokens = String(logprobs.length);
        // a generated answer's confidence: the geometric mean of its tokens' probabilities (as the cascade's)
        $("confidence").textContent = percent(Math.exp(logprobs.reduce((a, b) => a + b, 0) / logprobs.length));
      }
    }
  }
  throw new Error("The stream ended before the answer was complete; the server may have stopped.");
}

async function askCascade(model, body) {
  const result = await readJson(await postJson("/cascade", body));
  const generative = typeof result.text === "string";
  $("answer").textContent = generative ? result.text : result.answer;
  $("confidence").textContent = percent(result.confidence);
  showSource(result.source);
  const edge = generative ? result.edge_text : result.edge_answer;
  $("generated").textContent = edge + (result.cloud_error ? ` (the cloud failed: ${result.cloud_error})` : "");
}

// ---- start ------------------------------------------------------------------------------------------

async function start() {
  bindDrop();
  $("servable").addEventListener("change", servableChanged);
  $("version").addEventListener("change", modelChanged);
  document.querySelectorAll('input[name="route"]').forEach((radio) => radio.addEventListener("change", modelChanged));
  $("record").addEventListener("click", () => (page.recorder ? stopRecording() : startRecording()));
  $("clear-recording").addEventListener("click", () => setRecording(null, 0));
  $("new-conversation").addEventListener("click", newConversation);
  $("ask-form").addEventListener("submit", ask);
  try {
    page.settings = await getJson("/demo/settings");
    const cascade = page.settings.cascade;
    if (cascade) {
      $("cascade-edge").textContent = cascade.edge;
      $("cascade-threshold").textContent = cascade.threshold.toFixed(3);
    }
    await loadServables();
    document.body.dataset.ready = "true";
  } catch (error) {
    showError(error.message);
  }
}

start();
