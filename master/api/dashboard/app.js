// The a3c-http dashboard: polls /status and the new rows of /history (every 2 s while a run is
// running, every 10 s otherwise), draws them, and stops the run from its button. With A3C_TOKEN
// set on the master it asks for the token once per tab, keeps it in sessionStorage and sends it
// in the Authorization header only: never in a URL, so no log or browser history records it.
// Everything is written with textContent: worker ids and errors are never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "a3c-http-token";
  const RUNNING_MS = 2000, IDLE_MS = 10000, PAGE = 5000;
  const $ = (selector) => document.querySelector(selector);
  let token = sessionStorage.getItem(TOKEN_KEY);
  let timer = null, disarm = null, lastStatus = null;
  const run = {};

  class Unauthorized extends Error {}
  class Refused extends Error {}  // another error answer: its detail says why
  class Unreachable extends Error {}  // no answer at all

  async function api(path, init = {}) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    // The master takes a POST only as JSON (what a page of another site cannot send unasked).
    if (init.method === "POST") {
      headers["Content-Type"] = "application/json";
      init = { body: "{}", ...init };
    }
    let response;
    try {
      response = await fetch(path, { ...init, headers, cache: "no-store", credentials: "omit" });
    } catch (error) {
      throw new Unreachable(error.message);
    }
    if (response.status === 401) throw new Unauthorized();
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Refused(`${response.status}: ${body.detail || path}`);
    return body;
  }

  // -- the history: every episode once, then only the new ones ----------------------------------

  function resetRun(id) {
    Object.assign(run, { id, next: 0, evalNext: 0, x: [], y: [], mean: [], last100: [], sum: 0, steps: 0, evals: [] });
  }

  function addEpisodes(rows) {
    for (const row of rows) {
      run.steps += row.length;  // env steps of finished episodes, as global_steps counts them
      run.x.push(run.steps);
      run.y.push(row.reward);
      run.last100.push(row.reward);
      run.sum += row.reward;
      if (run.last100.length > 100) run.sum -= run.last100.shift();
      run.mean.push(run.sum / run.last100.length);
    }
  }

  resetRun(undefined);  // no run seen yet: the first page names one (or null)

  async function pullHistory() {
    for (;;) {
      const asked = run.next + run.evalNext;
      const page = await api(`/history?since=${run.next}&evaluations_since=${run.evalNext}&limit=${PAGE}`);
      // A new run, or the same one resumed after a crash with fewer rows than were shown (those
      // after its last save are lost): its history again from the start.
      if (page.run_id !== run.id || page.global_episode < run.next || page.evaluations_total < run.evalNext) {
        resetRun(page.run_id);
        if (asked > 0) continue;
      }
      addEpisodes(page.episodes);
      for (const e of page.evaluations) run.evals.push({ x: e.global_steps, mean: e.mean_return, std: e.std_return });
      run.next = page.next;
      run.evalNext = page.evaluations_next;
      if (!page.more) return;
    }
  }

  // -- drawing ----------------------------------------------------------------------------------

  // A figure with the decimals its size needs: 1.38 stays 1.38 (a target of 1.4 would be
  // another target), 17.25 reads 17.3, 475 reads 475; `digits` fixes them (0: counts).
  function number(v, digits) {
    if (v == null) return "–";
    const size = Math.abs(Number(v));
    const places = digits ?? (size >= 100 ? 0 : size >= 10 ? 1 : 2);
    return Number(v).toLocaleString(undefined, { maximumFractionDigits: places });
  }

  // Seconds since the epoch (the status's `*_at` fields) as this browser's date and time.
  const moment = (seconds) => new Date(seconds * 1000).toLocaleString();

  function duration(seconds) {
    if (seconds == null) return "–";
    const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
  }

  function cell(row, text, className) {
    const td = row.insertCell();
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function keyValues(table, entries) {
    const body = table.tBodies[0];
    body.replaceChildren();
    for (const [key, value] of entries) {
      const row = body.insertRow();
      cell(row, key);
      const text = typeof value === "number" && !Number.isInteger(value) ? String(Number(value.toPrecision(6)))
        : typeof value === "object" && value !== null ? JSON.stringify(value) : String(value);
      cell(row, text);
    }
  }

  function render(status) {
    const config = status.config || {};
    $("#state").textContent = status.state;
    $("#state").className = `badge ${status.state}`;
    $("#run-id").textContent = status.run_id ? `run ${status.run_id}` : "no run yet";
    $("#env-id").textContent = [status.env_id, config.algo].filter(Boolean).join(" · ");
    const evaluation = status.eval_mean_return == null ? (status.eval_error ? "failed" : "none yet")
      : `${number(status.eval_mean_return)} ± ${number(status.eval_std_return)}`;
    const figures = {
      global_episode: number(status.global_episode, 0),
      env_steps: number(status.env_steps, 0),
      mean_return_100: number(status.mean_return_100),
      best_score: number(status.best_score),
      target_return: number(config.target_return),
      evaluation,
      model_version: number(status.model_version, 0),
      elapsed_s: duration(status.elapsed_s),
    };
    for (const [field, text] of Object.entries(figures)) $(`[data-field="${field}"]`).textContent = text;
    // The run folder's trouble: a run the master could not resume, or saves that fail.
    const saving = status.save_error;
    const folder = status.resume_error ? status.resume_error.error
      : saving ? `Saving the run folder fails since ${new Date(saving.since * 1000).toLocaleTimeString()} `
        + `(${saving.failures} tries; retried every few seconds): ${saving.error}` : "";
    $("#folder").textContent = folder;
    $("#folder").hidden = !folder;

    const workers = $("#workers").tBodies[0];
    workers.replaceChildren();
    for (const w of status.workers || []) {
      const row = workers.insertRow();
      row.dataset.workerId = w.worker_id;
      cell(row, w.name ? `${w.worker_id} (${w.name})` : w.worker_id);
      cell(row, w.origin || "");
      cell(row, w.state, `state-${w.state}`);
      cell(row, number(w.episodes, 0), "num");
      cell(row, number(Math.max(w.env_steps || 0, w.steps || 0), 0), "num");
      cell(row, number(w.steps_per_s, 0), "num");
      cell(row, `${number(w.last_seen_s)} s ago`, "num");
      cell(row, w.url || "");
      cell(row, w.error || "", "error");
    }
    renderLearner(status.learner);
    renderShards(status.shards);
    const scalars = Object.entries(status).filter(([k, v]) => k !== "config" && k !== "workers" && (v === null || typeof v !== "object"));
    const waiting = status.waiting_workers || [];
    $("#waiting").textContent = waiting.length ? `Waiting for a run: ${waiting.join(", ")}` : "";
    $("#waiting").hidden = !waiting.length;
    keyValues($("#run"), scalars.map(([k, v]) => [k, v === null ? "–" : k.endsWith("_at") ? moment(v) : v]));
    keyValues($("#config"), Object.entries(config));
    $("#stop").disabled = status.state !== "running";
    A3CChart.draw($("#curve"), { x: run.x, y: run.y, mean: run.mean, target: config.target_return, evals: run.evals });
    $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  // The learner beside the master (ppo, impala, apex, apex_dpg, sac): its processes, its queue,
  // what it did and the last update's figures; hidden in runs that have none.
  function renderLearner(learner) {
    $("#learner-section").hidden = !learner;
    if (!learner) return;
    const team = [learner.pid, ...(learner.follower_pids || [])].filter((pid) => pid != null);
    $("#learner-state").textContent = learner.running
      ? `running on ${learner.device || "?"}, ${team.length === 1 ? "one process" : `a team of ${team.length}`}`
      : "not running";
    const rows = [
      ["pids", team.join(", ") || "–"],
      ["queued", `${number(learner.queued, 0)} of ${number(learner.capacity, 0)}`],
      ["updates", number(learner.updates, 0)],
      ["rollouts used", number(learner.rollouts_used, 0)],
      ["dropped as stale", number(learner.dropped_stale, 0)],
      ["steps undone (not finite)", number(learner.nonfinite_steps, 0)],
      ["restarts", number(learner.restarts, 0)],
      ["last error", learner.error || "–"],
      ...Object.entries(learner.metrics || {}),
    ];
    keyValues($("#learner"), rows);
  }

  // The parameter-server shards of a run with `shards` (a3c, dqn): each one's process, slice of
  // the parameters and the version it applied; hidden in runs that have none.
  function renderShards(shards) {
    $("#shards-section").hidden = !shards;
    if (!shards) return;
    const body = $("#shards").tBodies[0];
    body.replaceChildren();
    for (const s of shards) {
      const row = body.insertRow();
      row.dataset.shard = s.index;
      cell(row, s.index);
      cell(row, s.alive ? "running" : "down", s.alive ? "state-running" : "state-failed");
      cell(row, number(s.version, 0), "num");
      cell(row, `${number(s.slice[0], 0)} – ${number(s.slice[1], 0)}`, "num");
      cell(row, s.pid);
      cell(row, s.url);
    }
  }

  // -- the loop, the token and the stop button --------------------------------------------------

  function message(text) {
    $("#message").textContent = text || "";
    $("#message").hidden = !text;
  }

  function askToken(wrong) {
    clearTimeout(timer);
    $("#main").hidden = true;
    $("#token-form").hidden = false;
    message(wrong ? "The master refused that token (401): enter A3C_TOKEN again." : "");
    $("#token").focus();
  }

  async function refresh() {
    clearTimeout(timer);
    let delay = IDLE_MS;
    try {
      const status = await api("/status");
      await pullHistory();
      lastStatus = status;
      $("#main").hidden = false;
      message("");
      render(status);
      if (status.state === "running") delay = RUNNING_MS;
    } catch (error) {
      if (error instanceof Unauthorized) {
        const wrong = Boolean(token);
        token = null;
        sessionStorage.removeItem(TOKEN_KEY);
        askToken(wrong);
        return;
      }
      const what = error instanceof Unreachable ? "Cannot reach the master"
        : error instanceof Refused ? "The master answered" : "The dashboard failed";
      message(`${what}: ${error.message}. Trying again in ${IDLE_MS / 1000} s.`);
    }
    timer = setTimeout(refresh, delay);
  }

  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();  // the form is never sent: the token goes in a header
    token = $("#token").value.trim();
    $("#token").value = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    $("#token-form").hidden = true;
    refresh();
  });

  // Two clicks stop the run: the first arms the button for 4 s, so a stray click does nothing.
  $("#stop").addEventListener("click", async () => {
    const button = $("#stop");
    if (!button.classList.contains("armed")) {
      button.classList.add("armed");
      button.textContent = "Click again to stop";
      disarm = setTimeout(() => { button.classList.remove("armed"); button.textContent = "Stop run"; }, 4000);
      return;
    }
    clearTimeout(disarm);
    button.classList.remove("armed");
    button.textContent = "Stop run";
    button.disabled = true;
    try {
      await api("/stop", { method: "POST" });
    } catch (error) {
      message(error instanceof Unauthorized ? "The master refused the token." : `Stop failed: ${error.message}`);
    }
    refresh();
  });

  window.addEventListener("resize", () => { if (lastStatus) render(lastStatus); });
  refresh();
})();
