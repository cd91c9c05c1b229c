// The dispatcher dashboard: plain JS, no build step. This file holds what
// every view shares (talking to the service, the event stream, routing,
// formatting) and the overview; dashboard-pages.js holds the job, task and
// history pages.
//
// Authentication is the HttpOnly session cookie set by /v1/session; this
// script never sees a token (there is none for it to see). Every write carries
// X-Requested-With, which the service requires of cookie-authenticated writes.
// Live updates come from the event stream; a light poll refreshes progress
// and ETAs, which change without events. Text from tasks (prompts, errors,
// answers) only ever reaches the page as text nodes, never as markup.
"use strict";

(() => {
  const WRITE_HEADER = { "X-Requested-With": "dispatcher-dashboard" };
  const TERMINAL = new Set(["success", "failed", "canceled"]);
  const MAX_RUNNING_SHOWN = 100;
  const NEXT_SHOWN = 20;
  const STATES = ["pending", "running", "success", "failed", "canceled"];
  const REFRESH_DEBOUNCE_MS = 150;
  const POLL_BUSY_MS = 2000;
  const POLL_IDLE_MS = 10000;
  const MAX_ACTIVITY = 60;
  const SEEDED_ACTIVITY = 25;

  const view = {
    signedIn: null, // null: not known yet
    route: { name: "overview", id: null },
    lanes: [],
    accounts: [],
    jobs: [],
    tasks: [],
    deliveries: null, // the webhook delivery log, where the service has one
    hosts: null, // the hosts sharing the database, where the service lists them
    features: null, // which optional endpoints the service offers (from its OpenAPI document)
  };
  // Pages register here (dashboard-pages.js): {load(route) -> Promise, render(), onTask(task)}.
  const pages = {};
  let source = null;
  let refreshTimer = null;
  let refreshing = false;
  let refreshAgain = false;
  let pollTimer = null;
  const seenActivity = new Set();

  const $ = (id) => document.getElementById(id);

  // -- small DOM helpers (text only: prompts and errors are never parsed as HTML) --
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function short(id) {
    return id ? String(id).slice(0, 8) : "";
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
    if (seconds > 0 && seconds < 1) return `${seconds.toFixed(1)}s`;
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
  }

  // Every time carries its day: a bare "03:12" read days later misleads.
  // Today's say "today"; others the ISO date, which reads the same everywhere.
  function when(ts) {
    if (!ts) return "";
    const date = new Date(ts * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
    if (new Date().toDateString() === date.toDateString()) return `today ${time}`;
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${time}`;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "";
    if (n < 1024) return `${n} B`;
    const units = ["KiB", "MiB", "GiB"];
    let value = n / 1024;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
  }

  function errorText(error) {
    if (!error) return "";
    if (typeof error === "string") return error;
    return `${error.kind}: ${error.message}`;
  }

  // The ETA column: a running task past its estimate is overdue, not "0s".
  function etaText(task) {
    if (task.state === "running") {
      if (task.overdue_s >= 1) return { text: `overdue by ${duration(task.overdue_s)}`, late: true };
      if (task.overdue_s > 0) return { text: "overdue", late: true };
      if (task.eta_s === 0) return { text: "overdue", late: true };
      return { text: duration(task.eta_s), late: false };
    }
    // A task no lane can take has no ETA: the reason instead.
    if (task.state === "pending" && task.waiting) return { text: task.waiting, late: true };
    if (task.state === "pending") return { text: duration(task.eta_s), late: false };
    return { text: "", late: false };
  }

  // From the first attempt's start: a task retried twice took all three attempts
  // and the waits between them, not only its last run.
  function elapsed(task) {
    const starts = (task.attempts || []).map((a) => a.started_at).filter(Boolean);
    if (task.started_at) starts.push(task.started_at);
    if (!starts.length) return null;
    const end = task.finished_at || Date.now() / 1000;
    return end - Math.min(...starts);
  }

  // Lists come as a plain array today and as {"items": [...], "next": cursor} once paged.
  function itemsOf(answer) {
    return Array.isArray(answer) ? answer : (answer && answer.items) || [];
  }

  function toast(message, isError) {
    const box = $("toast");
    box.textContent = message;
    box.className = isError ? "toast error" : "toast";
    box.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { box.hidden = true; }, isError ? 8000 : 3000);
  }

  function taskLink(task, label) {
    return el("a", { href: `#task/${task.id}`, class: "mono", title: task.id,
      "data-testid": "task-link" }, label || task.ref || short(task.id));
  }

  function activity(text, kind, ts, task) {
    const list = $("activity");
    const item = el("li", { class: kind || "", "data-testid": "activity-item",
      "data-ts": ts || Date.now() / 1000 },
      el("span", { class: "muted", text: when(ts || Date.now() / 1000) }), " ",
      task ? taskLink(task) : null, task ? " " : null, text);
    // Kept in time order: seeded entries from the store may be older than live ones.
    const after = [...list.children].find((li) => Number(li.dataset.ts) < Number(item.dataset.ts));
    list.insertBefore(item, after || null);
    while (list.children.length > MAX_ACTIVITY) list.lastElementChild.remove();
    $("activity-empty").hidden = true;
  }

  function taskActivity(task) {
    const key = `${task.id}:${task.attempt}:${task.state}`;
    if (seenActivity.has(key)) return;
    const ts = task.finished_at || Date.now() / 1000;
    const prompt = task.params && typeof task.params.prompt === "string" ? task.params.prompt : "";
    const snippet = prompt.length > 60 ? `${prompt.slice(0, 57)}…` : prompt;
    const what = `${task.model}${snippet ? ` “${snippet}”` : ""}`;
    if (task.state === "failed") {
      seenActivity.add(key);
      activity(`${what} failed: ${errorText(task.error)}`, "bad", ts, task);
    } else if (task.state === "canceled") {
      seenActivity.add(key);
      activity(`${what} canceled`, "warn", ts, task);
    } else if (task.state === "success") {
      seenActivity.add(key);
      activity(`${what} done${task.from_cache ? " (from cache)" : ""}`, "good", ts, task);
    } else if (task.state === "pending" && task.attempt > 1 && task.error) {
      seenActivity.add(key);
      activity(`${what} will retry (attempt ${task.attempt}): ${errorText(task.error)}`, "warn",
        null, task);
    }
  }

  // -- talking to the service ----------------------------------------------------------
  class SignedOut extends Error {}

  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", cache: "no-store",
                   headers: { Accept: "application/json" } };
    if (method !== "GET") {
      Object.assign(init.headers, WRITE_HEADER, { "Content-Type": "application/json" });
      init.body = JSON.stringify(body || {});
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      setLive(false, "the service does not answer");
      throw err;
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_err) {
      data = null;
    }
    const message = data && data.error ? data.error.message : `HTTP ${response.status}`;
    if (response.status === 401 || (response.status === 403 && method === "GET")) {
      signOut(message);
      throw new SignedOut(message);
    }
    if (!response.ok) {
      const err = new Error(message);
      err.status = response.status;
      throw err;
    }
    return data;
  }

  function signOut(detail) {
    view.signedIn = false;
    view.lanes = []; view.accounts = []; view.jobs = []; view.tasks = [];
    for (const id of ["lanes-body", "accounts-body", "hosts-body", "jobs-body", "tasks-body", "activity",
      "job-page", "task-page", "history-body"]) {
      $(id).replaceChildren();
    }
    $("app").hidden = true;
    $("signed-out").hidden = false;
    $("signed-out-detail").textContent = detail || "";
    setLive(false, "not signed in");
    if (source) { source.close(); source = null; }
    clearTimeout(pollTimer);
  }

  function signIn() {
    if (view.signedIn) return;
    view.signedIn = true;
    $("signed-out").hidden = true;
    $("app").hidden = false;
    connect();
    seedActivity();
  }

  // Optional parts of the API are looked up once, so that a service without
  // them is never asked (a 404 would be noise in every browser console).
  async function features() {
    if (view.features === null) {
      try {
        const doc = await api("GET", "/openapi.json");
        const paths = Object.keys((doc && doc.paths) || {});
        view.features = { webhooks: paths.includes("/v1/webhooks/deliveries"),
          hosts: paths.includes("/v1/hosts") };
      } catch (err) {
        if (err instanceof SignedOut) throw err;
        view.features = { webhooks: false, hosts: false };
      }
    }
    return view.features;
  }

  function setLive(on, text) {
    const badge = $("live");
    badge.dataset.live = on ? "yes" : "no";
    badge.textContent = text || (on ? "live" : "reconnecting…");
  }

  // What finished before this page loaded comes from the store, so the
  // activity survives a reload.
  async function seedActivity() {
    try {
      const answer = await api("GET",
        `/v1/tasks?state=failed,canceled,success&limit=${SEEDED_ACTIVITY * 4}`);
      const finished = itemsOf(answer).filter((t) => t.finished_at)
        .sort((a, b) => b.finished_at - a.finished_at).slice(0, SEEDED_ACTIVITY);
      for (const task of finished.reverse()) taskActivity(task);
    } catch (err) {
      if (!(err instanceof SignedOut)) toast(`could not read the recent activity: ${err.message}`, true);
    }
  }

  // -- routing ---------------------------------------------------------------------------
  function parseRoute() {
    const [name, id] = decodeURIComponent(location.hash.replace(/^#/, "")).split("/");
    if ((name === "task" || name === "job" || name === "login") && id) return { name, id };
    if (name === "history") return { name, id: id === "jobs" ? "jobs" : "tasks" };
    return { name: "overview", id: null };
  }

  function showRoute() {
    view.route = parseRoute();
    for (const node of document.querySelectorAll("[data-view]")) {
      node.hidden = node.dataset.view !== view.route.name;
    }
    for (const link of document.querySelectorAll("[data-nav]")) {
      link.classList.toggle("current", link.dataset.nav === view.route.name);
    }
    const page = pages[view.route.name];
    if (page && page.enter) page.enter(view.route);
    document.title = view.route.name === "overview" ? "dispatcher" : `dispatcher · ${view.route.name}`;
    window.scrollTo(0, 0);
    scheduleRefresh(0);
  }

  // -- refreshing --------------------------------------------------------------------------
  function scheduleRefresh(delay) {
    if (view.signedIn === false) return;
    if (refreshing) { refreshAgain = true; return; }
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); },
      delay === undefined ? REFRESH_DEBOUNCE_MS : delay);
  }

  async function refresh() {
    refreshing = true;
    const route = view.route;
    try {
      const lanes = api("GET", "/v1/lanes");
      lanes.catch(() => {}); // awaited below; a refusal is reported once, by whichever fails first
      if (route.name === "overview") {
        const offered = await features();
        // What runs, the next to run (oldest waiting first) and counts per queue:
        // never every waiting task.
        const [accounts, jobs, running, next, queues, deliveries, hosts] = await Promise.all([
          api("GET", "/v1/accounts"),
          api("GET", "/v1/jobs?limit=10"),
          api("GET", `/v1/tasks?state=running&limit=${MAX_RUNNING_SHOWN}`),
          api("GET", `/v1/tasks?state=pending&order=oldest&limit=${NEXT_SHOWN}`),
          api("GET", "/v1/queues"),
          offered.webhooks ? api("GET", "/v1/webhooks/deliveries") : null,
          offered.hosts ? api("GET", "/v1/hosts") : null,
        ]);
        view.accounts = accounts;
        view.jobs = itemsOf(jobs);
        view.tasks = [...itemsOf(running), ...itemsOf(next)];
        view.queues = queues;
        view.deliveries = deliveries;
        view.hosts = hosts;
      } else if (pages[route.name]) {
        await pages[route.name].load(route);
      }
      view.lanes = await lanes;
      signIn();
      if (route === view.route) render();
      $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (!(err instanceof SignedOut) && view.signedIn) toast(`refresh failed: ${err.message}`, true);
    } finally {
      refreshing = false;
      if (refreshAgain) { refreshAgain = false; scheduleRefresh(); }
      schedulePoll();
    }
  }

  function schedulePoll() {
    clearTimeout(pollTimer);
    if (view.signedIn === false) return;
    const busy = view.lanes.some((lane) => lane.running.length > 0 || lane.queued > 0);
    pollTimer = setTimeout(() => scheduleRefresh(0), busy ? POLL_BUSY_MS : POLL_IDLE_MS);
  }

  function render() {
    if (view.route.name === "overview") {
      renderLanes();
      renderAccounts();
      renderHosts();
      renderJobs();
      renderTasks();
      renderDeliveries();
    } else if (pages[view.route.name]) {
      pages[view.route.name].render();
    }
  }

  // -- the event stream ----------------------------------------------------------------------
  function connect() {
    if (source) return;
    source = new EventSource("/v1/events");
    source.onopen = () => { setLive(true); scheduleRefresh(0); };
    source.addEventListener("task", (message) => {
      const event = JSON.parse(message.data);
      onTaskEvent(event.task);
    });
    source.addEventListener("account", (message) => {
      const event = JSON.parse(message.data);
      onAccountEvent(event.account);
      scheduleRefresh();
    });
    source.onerror = () => {
      setLive(false);
      if (source && source.readyState === EventSource.CLOSED) {
        // Refused (401/403) or a bad answer: find out which, then try again.
        source.close();
        source = null;
        api("GET", "/v1/lanes").then(() => setTimeout(connect, 2000)).catch(() => {
          if (view.signedIn) setTimeout(connect, 3000);
        });
      }
    };
  }

  function onTaskEvent(task) {
    const index = view.tasks.findIndex((t) => t.id === task.id);
    if (index >= 0) {
      view.tasks[index] = { ...view.tasks[index], ...task };
      const row = document.querySelector(`#tasks-body tr[data-task-id="${CSS.escape(task.id)}"]`);
      if (row) row.replaceWith(taskRow(view.tasks[index]));
    }
    taskActivity(task);
    const page = pages[view.route.name];
    const concerned = page && page.onTask ? page.onTask(task) : view.route.name === "overview";
    if (concerned) scheduleRefresh();
  }

  function onAccountEvent(account) {
    const index = view.accounts.findIndex((a) => a.name === account.name);
    if (index >= 0) view.accounts[index] = account;
    if (view.route.name === "overview") renderAccounts();
    activity(`${account.kind}:${account.name} ${stateText(account)}${account.reason ? ` — ${account.reason}` : ""}`,
      accountOpen(account) ? "good" : "warn");
  }

  // One visible state per account or provider (dispatcher/accounts/health.py).
  function accountOpen(account) {
    return account.state ? account.state === "ok" : account.enabled && !account.needs_attention;
  }

  function stateText(account) {
    const state = account.state || (account.needs_attention ? "needs_attention"
      : account.enabled ? "ok" : "disabled");
    if (state === "cooldown" && account.until) return `cooldown until ${when(account.until)}`;
    if (state === "unreachable" && account.since) return `unreachable since ${when(account.since)}`;
    return state.replace("_", " ");
  }

  // -- actions ----------------------------------------------------------------------------------
  async function act(button, method, path, body, done) {
    button.disabled = true;
    try {
      const answer = await api(method, path, body);
      if (done) toast(done(answer));
      scheduleRefresh(0);
      return answer;
    } catch (err) {
      if (!(err instanceof SignedOut)) toast(err.message, true);
      button.disabled = false;
      return null;
    }
  }

  function cancelTask(button, task) {
    const what = task.ref || short(task.id);
    if (!window.confirm(`Cancel task ${what} (${task.model})? A running generation is stopped.`)) return;
    act(button, "POST", `/v1/tasks/${task.id}/cancel`, {}, (a) => `task ${short(a.id)}: ${a.state}`);
  }

  function retryTask(button, task) {
    act(button, "POST", `/v1/tasks/${task.id}/retry`, {},
      (a) => `task ${short(a.id)}: attempt ${a.attempt} queued`);
  }

  function cancelJob(button, job) {
    const open = job.counts.pending + job.counts.running;
    if (!window.confirm(`Cancel job “${job.name}”? Its ${open} unfinished tasks stop.`)) return;
    act(button, "POST", `/v1/jobs/${job.id}/cancel`, {},
      (a) => `job ${a.name}: canceling ${a.counts.pending + a.counts.running}`);
  }

  function retryJob(button, job) {
    act(button, "POST", `/v1/jobs/${job.id}/retry`, {}, (a) => `job ${a.name}: retrying failed tasks`);
  }

  function disableAccount(button, account) {
    const reason = window.prompt(`Why disable ${account.kind}:${account.name}? `
      + "(shown to the team; its running task finishes)", "");
    if (reason === null) return;
    if (!reason.trim()) { toast("disabling needs a reason", true); return; }
    act(button, "POST", `/v1/accounts/${encodeURIComponent(account.name)}/disable`,
      { reason: reason.trim() }, () => `${account.name} disabled`);
  }

  function enableAccount(button, account) {
    act(button, "POST", `/v1/accounts/${encodeURIComponent(account.name)}/enable`, {},
      () => `${account.name} enabled`);
  }

  // -- rendering: shared pieces ------------------------------------------------------------------
  function badge(stateName, extra) {
    return el("span", { class: `state ${stateName}`, "data-testid": "state", text: stateName },
      extra || null);
  }

  function progressBar(counts, total, testid) {
    const done = counts.success + counts.failed + counts.canceled;
    const bar = el("div", { class: "bar", "data-testid": testid, "data-done": done,
      "data-total": total, role: "progressbar", "aria-valuemin": 0, "aria-valuemax": total,
      "aria-valuenow": done });
    for (const name of ["success", "failed", "canceled", "running"]) {
      if (!counts[name] || !total) continue;
      bar.append(el("span", { class: `seg ${name}`, "data-width": counts[name] / total }));
    }
    // Widths go through the CSSOM (style attributes are blocked by the page's CSP).
    for (const seg of bar.children) seg.style.width = `${(Number(seg.dataset.width) * 100).toFixed(2)}%`;
    return el("div", { class: "progress" }, bar,
      el("span", { class: "bar-label", "data-testid": `${testid}-label`, text: `${done}/${total}` }));
  }

  function laneOf(task) {
    if (task.owner) return `${task.kind}:${task.owner}`;
    const serving = view.lanes.filter((lane) => !lane.invalid && lane.models.includes(task.model));
    if (serving.length === 1) return serving[0].name;
    return `${task.kind}:${task.model} (any account)`;
  }

  // A running task's stage in a few words: "generating 55% · node 3 (KSampler)",
  // "queued · queued on server, 2 ahead", "generating · waiting for the server ...".
  function stageText(task) {
    let stage = task.state === "running" ? (task.stage || "") : "";
    if (stage && task.progress !== null && task.progress !== undefined) {
      stage += ` ${Math.round(task.progress)}%`;
    }
    if (stage && task.stage_detail) {
      stage += ` · ${task.stage_detail}`;
    } else if (stage && task.queue_position !== null && task.queue_position !== undefined) {
      stage += ` (queue ${task.queue_position})`;
    }
    return stage;
  }

  function taskRow(task) {
    const lane = laneOf(task);
    let stage = stageText(task);
    if (task.cancel_requested && !TERMINAL.has(task.state)) stage += " · canceling";
    const error = errorText(task.error);
    const running = task.state === "pending" || task.state === "running";
    const eta = etaText(task);
    const open = (event) => {
      // A click on the row opens the task; its buttons and links keep their own meaning.
      if (event.target.closest("button, a")) return;
      location.hash = `#task/${task.id}`;
    };
    return el("tr", { "data-testid": "task-row", "data-task-id": task.id, "data-state": task.state,
      class: "clickable", onclick: open },
      el("td", {}, taskLink(task)),
      el("td", { text: task.model }),
      el("td", { class: "mono", text: lane }),
      el("td", {}, badge(task.state, task.from_cache ? " (cache)" : null)),
      el("td", { "data-testid": "task-stage", text: stage }),
      el("td", { class: "num", "data-testid": "task-attempt", text: `${task.attempt}/${task.max_attempts}` }),
      el("td", { class: "num", "data-testid": "task-ahead", text: task.state === "pending" ? task.ahead : "" }),
      el("td", { class: `num${eta.late ? " late" : ""}`, "data-testid": "task-eta", text: eta.text }),
      el("td", { class: "error", "data-testid": "task-error", title: error, text: error }),
      el("td", { class: "actions" },
        el("button", { type: "button", "data-testid": "task-cancel", class: "danger",
          disabled: !running || task.cancel_requested, text: "cancel",
          onclick: (e) => cancelTask(e.currentTarget, task) }),
        el("button", { type: "button", "data-testid": "task-retry", disabled: task.state !== "failed",
          text: "retry", onclick: (e) => retryTask(e.currentTarget, task) })));
  }

  function jobActions(job) {
    const c = job.counts;
    return [
      el("button", { type: "button", "data-testid": "job-cancel", class: "danger",
        disabled: c.pending + c.running === 0, text: "cancel",
        onclick: (e) => cancelJob(e.currentTarget, job) }),
      el("button", { type: "button", "data-testid": "job-retry", disabled: !c.failed,
        text: "retry failed", onclick: (e) => retryJob(e.currentTarget, job) }),
    ];
  }

  function jobRow(job) {
    const c = job.counts;
    return el("tr", { "data-testid": "job-row", "data-job-id": job.id, "data-state": job.state },
      el("td", {},
        el("a", { href: `#job/${job.id}`, "data-testid": "job-select", title: `open job ${job.id}`,
          text: job.name }),
        el("div", { class: "mono muted", text: short(job.id) })),
      el("td", {}, badge(job.state)),
      el("td", { class: "muted", "data-testid": "job-created", text: when(job.created_at) }),
      el("td", { class: "wide" }, progressBar(c, job.total, "job-progress")),
      ...STATES.map((name) => el("td", { class: `num ${name}`, "data-testid": `job-${name}`,
        text: c[name] })),
      el("td", { class: "num", "data-testid": "job-cost", text: usd(job.cost_usd) }),
      el("td", { class: "actions" }, ...jobActions(job)));
  }

  // -- rendering: the overview -------------------------------------------------------------------
  function renderLanes() {
    const byId = new Map(view.tasks.map((t) => [t.id, t]));
    $("lanes-body").replaceChildren(...view.lanes.map((lane) => {
      const open = accountOpen(lane);
      const running = lane.running.length
        ? lane.running.map((id) => {
          const task = byId.get(id);
          return el("a", { class: "mono", href: `#task/${id}`, title: id,
            "data-testid": "lane-running-task" }, short(id), task ? ` ${task.model}` : "");
        })
        : [el("span", { class: "muted", text: "–" })];
      const spaced = running.flatMap((node, i) => (i ? [", ", node] : [node]));
      return el("tr", { "data-testid": "lane-row", "data-lane": lane.name },
        el("td", { class: "mono", text: lane.name }),
        el("td", { text: lane.kind || "" }),
        el("td", { text: lane.models.join(", ") }),
        el("td", { class: "num", "data-testid": "lane-concurrency",
          title: "effective / quota (halved while 429s storm)",
          text: lane.effective_concurrency !== undefined && lane.effective_concurrency !== lane.concurrency
            ? `${lane.effective_concurrency} / ${lane.concurrency}` : lane.concurrency }),
        el("td", { "data-testid": "lane-enabled", "data-enabled": open ? "yes" : "no",
          "data-state": lane.state || "" },
          open ? "yes" : el("span", { class: "bad", text: lane.invalid ? "invalid profile" : stateText(lane) }),
          !open && lane.reason ? el("div", { class: "muted", text: lane.reason }) : null),
        el("td", {}, ...spaced),
        el("td", { class: "num", "data-testid": "lane-queued", text: lane.queued }),
        el("td", { "data-testid": "lane-budget", "data-reached": lane.budget?.reached ? "yes" : "no" },
          budgetText(lane.budget)));
    }));
  }

  // Dollars, and a provider's daily budget as the lanes table shows it (issue 30).
  function usd(value) {
    return value === null || value === undefined ? "–" : `$${Number(value).toFixed(2)}`;
  }

  function budgetText(budget) {
    if (!budget) return el("span", { class: "muted", text: "–" });
    const spent = `${usd(budget.spent_usd)} of ${usd(budget.daily_usd)} today`;
    return budget.reached
      ? el("span", { class: "bad", text: `${spent}: reached until 00:00 UTC` })
      : el("span", { text: spent });
  }

  // What dashboard-login.js adds (loaded after this file).
  const D = () => window.dispatcherDashboard;

  function renderAccounts() {
    $("accounts-body").replaceChildren(...view.accounts.map((account) => {
      const open = accountOpen(account);
      const status = stateText(account);
      // The operator's switch: a cooling-down account is still switched on.
      const button = open || (account.state === "cooldown")
        ? el("button", { type: "button", "data-testid": "account-disable", class: "danger",
          text: "disable", onclick: (e) => disableAccount(e.currentTarget, account) })
        : el("button", { type: "button", "data-testid": "account-enable",
          text: account.needs_attention ? "re-enable" : "enable",
          onclick: (e) => enableAccount(e.currentTarget, account) });
      const login = account.kind === "web" && D().openLogin
        ? el("button", { type: "button", "data-testid": "account-login", text: "log in",
          title: "open its browser here and log in", onclick: (e) => D().openLogin(e.currentTarget, account) })
        : null;
      return el("tr", { "data-testid": "account-row", "data-account": account.name,
        "data-enabled": open ? "yes" : "no", "data-state": account.state || "" },
        el("td", { class: "mono", text: account.name }),
        el("td", { text: account.kind }),
        el("td", {}, el("span", { class: `switch ${open ? "on" : "off"}`, "data-testid": "account-status",
          text: status })),
        el("td", { "data-testid": "account-reason", text: account.reason || "" }),
        el("td", { class: "muted", text: when(account.updated_at) }),
        el("td", {}, button, login));
    }));
  }

  // Shown once a second host shares the database: one host alone needs no list.
  function renderHosts() {
    const hosts = view.hosts || [];
    $("hosts").hidden = hosts.length < 2;
    $("hosts-body").replaceChildren(...hosts.map((host) => el("tr", { "data-testid": "host-row",
      "data-host": host.host, "data-state": host.state },
      el("td", { class: "mono" }, host.host, host.this_host ? el("span", { class: "muted", text: " (this host)" })
        : null),
      el("td", {}, el("span", { class: `switch ${host.state === "alive" ? "on" : "off"}`,
        "data-testid": "host-state", text: host.state })),
      el("td", { class: "muted", text: `${duration(host.silent_s)} ago` }),
      el("td", { class: "mono", "data-testid": "host-accounts", text: (host.accounts || []).join(", ") || "–" }),
      el("td", { class: "num", "data-testid": "host-running", text: String(host.running) }),
      el("td", { class: "muted", text: when(host.started_at) }))));
  }

  function renderJobs() {
    $("jobs-empty").hidden = view.jobs.length > 0;
    $("jobs-body").replaceChildren(...view.jobs.map(jobRow));
  }

  function renderTasks() {
    const waiting = (view.queues || []).reduce((sum, q) => sum + q.waiting, 0);
    const shown = view.tasks.filter((t) => t.state === "pending").length;
    $("queues").replaceChildren(...(view.queues || []).map((q) => el("span", {
      class: "queue", "data-testid": "queue-count", "data-queue": q.queue, text: `${q.queue}: ${q.waiting} waiting` })),
    waiting > shown ? el("span", { class: "muted", "data-testid": "next-note",
      text: `the next ${shown} to run are listed` }) : null);
    $("tasks-empty").hidden = view.tasks.length > 0;
    $("tasks-body").replaceChildren(...view.tasks.map(taskRow));
  }

  function renderDeliveries() {
    const log = view.deliveries;
    $("webhooks").hidden = !log;
    if (!log) return;
    const urls = log.urls || [];
    $("webhooks-summary").textContent = `${urls.length ? `to ${urls.join(", ")}` : "no URL configured"}`
      + ` · ${log.queued || 0} queued · ${log.delivering || 0} in flight`
      + (log.dropped ? ` · ${log.dropped} dropped` : "");
    const items = itemsOf(log).slice(0, 15);
    $("webhooks-empty").hidden = items.length > 0;
    $("webhooks-body").replaceChildren(...items.map((d) => el("tr", {
      "data-testid": "delivery-row", class: d.ok ? "" : "bad" },
      el("td", { class: "muted", text: when(d.at) }),
      el("td", { class: "mono", text: d.event || "" }),
      el("td", { class: "mono", text: d.url || "" }),
      el("td", { class: "num", text: d.attempt ?? "" }),
      el("td", {}, el("span", { class: d.ok ? "switch on" : "switch off",
        text: d.status ? `HTTP ${d.status}` : "no answer" }),
        !d.ok && !d.final ? el("span", { class: "muted", text: " (will retry)" }) : null),
      el("td", { class: "num", text: d.duration_ms !== undefined ? `${Math.round(d.duration_ms)} ms` : "" }),
      el("td", { class: "error", text: d.error || "" }))));
  }

  // -- for dashboard-pages.js ---------------------------------------------------------------------
  window.dispatcherDashboard = {
    $, el, short, duration, when, bytes, errorText, etaText, elapsed, itemsOf, toast, usd,
    api, SignedOut, act, badge, progressBar, laneOf, stageText, taskRow, taskLink, jobRow, jobActions,
    cancelTask, retryTask, view, pages, scheduleRefresh, STATES, TERMINAL,
  };

  // -- start ----------------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    window.addEventListener("hashchange", showRoute);
    showRoute();
  });
})();
