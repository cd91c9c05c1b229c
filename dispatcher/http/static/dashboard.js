// The dispatcher dashboard: plain JS, no build step.
//
// Authentication is the HttpOnly session cookie set by /v1/session; this
// script never sees a token (there is none for it to see). Every write carries
// X-Requested-With, which the service requires of cookie-authenticated writes.
// Live updates come from the event stream; a light poll refreshes progress
// and ETAs, which change without events.
"use strict";

(() => {
  const WRITE_HEADER = { "X-Requested-With": "dispatcher-dashboard" };
  const TERMINAL = new Set(["success", "failed", "canceled"]);
  const STATES = ["pending", "running", "success", "failed", "canceled"];
  const REFRESH_DEBOUNCE_MS = 150;
  const POLL_BUSY_MS = 2000;
  const POLL_IDLE_MS = 10000;
  const MAX_ACTIVITY = 60;

  const view = {
    signedIn: null, // null: not known yet
    selectedJob: null,
    lanes: [],
    accounts: [],
    jobs: [],
    tasks: [],
    busy: false,
  };
  let source = null;
  let refreshTimer = null;
  let refreshing = false;
  let refreshAgain = false;
  let pollTimer = null;

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
    for (const child of children) {
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
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
  }

  function clock(ts) {
    return ts ? new Date(ts * 1000).toLocaleTimeString() : "";
  }

  function toast(message, isError) {
    const box = $("toast");
    box.textContent = message;
    box.className = isError ? "toast error" : "toast";
    box.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { box.hidden = true; }, isError ? 8000 : 3000);
  }

  function activity(text, kind) {
    const list = $("activity");
    list.prepend(el("li", { class: kind || "", "data-testid": "activity-item" },
      el("span", { class: "muted", text: new Date().toLocaleTimeString() }), " ", text));
    while (list.children.length > MAX_ACTIVITY) list.lastElementChild.remove();
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
    if (!response.ok) throw new Error(message);
    return data;
  }

  function signOut(detail) {
    view.signedIn = false;
    view.lanes = []; view.accounts = []; view.jobs = []; view.tasks = [];
    for (const id of ["lanes-body", "accounts-body", "jobs-body", "tasks-body", "activity"]) {
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
  }

  function setLive(on, text) {
    const badge = $("live");
    badge.dataset.live = on ? "yes" : "no";
    badge.textContent = text || (on ? "live" : "reconnecting…");
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
    try {
      const tasksPath = view.selectedJob
        ? `/v1/jobs/${encodeURIComponent(view.selectedJob)}`
        : "/v1/tasks?state=running,pending&limit=200";
      const [lanes, accounts, jobs, tasks] = await Promise.all([
        api("GET", "/v1/lanes"),
        api("GET", "/v1/accounts"),
        api("GET", "/v1/jobs?limit=30"),
        api("GET", tasksPath).catch((err) => {
          if (view.selectedJob && !(err instanceof SignedOut)) {
            view.selectedJob = null; // the job is gone: back to the active tasks
            return null;
          }
          throw err;
        }),
      ]);
      signIn();
      view.lanes = lanes;
      view.accounts = accounts;
      view.jobs = jobs.items;
      if (tasks !== null) view.tasks = view.selectedJob ? tasks.tasks : tasks.items;
      render();
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

  // -- the event stream ----------------------------------------------------------------------
  function connect() {
    if (source) return;
    source = new EventSource("/v1/events");
    source.onopen = () => { setLive(true); scheduleRefresh(0); };
    source.addEventListener("task", (message) => {
      const event = JSON.parse(message.data);
      onTaskEvent(event.task);
      scheduleRefresh();
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
      const row = document.querySelector(`tr[data-task-id="${CSS.escape(task.id)}"]`);
      if (row) row.replaceWith(taskRow(view.tasks[index]));
    }
    if (task.state === "failed") {
      const error = task.error ? `${task.error.kind}: ${task.error.message}` : "";
      activity(`task ${short(task.id)} (${task.model}) failed: ${error}`, "bad");
    } else if (task.state === "canceled") {
      activity(`task ${short(task.id)} (${task.model}) canceled`, "warn");
    } else if (task.state === "pending" && task.attempt > 1 && task.error) {
      activity(`task ${short(task.id)} (${task.model}) will retry (attempt ${task.attempt}): `
        + `${task.error.kind}: ${task.error.message}`, "warn");
    }
  }

  function onAccountEvent(account) {
    const index = view.accounts.findIndex((a) => a.name === account.name);
    if (index >= 0) view.accounts[index] = account;
    renderAccounts();
    const what = account.needs_attention ? "needs attention"
      : account.enabled ? "enabled" : "disabled";
    activity(`${account.kind}:${account.name} ${what}${account.reason ? ` — ${account.reason}` : ""}`,
      account.enabled && !account.needs_attention ? "good" : "warn");
  }

  // -- actions ----------------------------------------------------------------------------------
  async function act(button, method, path, body, done) {
    button.disabled = true;
    try {
      const answer = await api(method, path, body);
      if (done) toast(done(answer));
      scheduleRefresh(0);
    } catch (err) {
      if (!(err instanceof SignedOut)) toast(err.message, true);
      button.disabled = false;
    }
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

  function selectJob(jobId) {
    view.selectedJob = jobId;
    view.tasks = [];
    renderTasks();
    scheduleRefresh(0);
  }

  // -- rendering ----------------------------------------------------------------------------------
  function render() {
    renderLanes();
    renderAccounts();
    renderJobs();
    renderTasks();
  }

  function badge(stateName, extra) {
    return el("span", { class: `state ${stateName}`, "data-testid": "state", text: stateName },
      extra || null);
  }

  function renderLanes() {
    const byId = new Map(view.tasks.map((t) => [t.id, t]));
    $("lanes-body").replaceChildren(...view.lanes.map((lane) => {
      const open = lane.enabled && !lane.needs_attention;
      const running = lane.running.length
        ? lane.running.map((id) => {
          const task = byId.get(id);
          return el("span", { class: "mono", title: id, "data-testid": "lane-running-task" },
            short(id), task ? ` ${task.model}` : "");
        })
        : [el("span", { class: "muted", text: "–" })];
      const spaced = running.flatMap((node, i) => (i ? [", ", node] : [node]));
      return el("tr", { "data-testid": "lane-row", "data-lane": lane.name },
        el("td", { class: "mono", text: lane.name }),
        el("td", { text: lane.kind }),
        el("td", { text: lane.models.join(", ") }),
        el("td", { class: "num", text: lane.concurrency }),
        el("td", { "data-testid": "lane-enabled", "data-enabled": open ? "yes" : "no" },
          open ? "yes" : el("span", { class: "bad", text: lane.needs_attention ? "needs attention" : "no" }),
          !open && lane.reason ? el("div", { class: "muted", text: lane.reason }) : null),
        el("td", {}, ...spaced),
        el("td", { class: "num", "data-testid": "lane-queued", text: lane.queued }));
    }));
  }

  function renderAccounts() {
    $("accounts-body").replaceChildren(...view.accounts.map((account) => {
      const open = account.enabled && !account.needs_attention;
      const status = account.needs_attention ? "needs attention" : account.enabled ? "enabled" : "disabled";
      const button = open
        ? el("button", { type: "button", "data-testid": "account-disable", class: "danger",
          text: "disable", onclick: (e) => disableAccount(e.currentTarget, account) })
        : el("button", { type: "button", "data-testid": "account-enable",
          text: account.needs_attention ? "re-enable" : "enable",
          onclick: (e) => enableAccount(e.currentTarget, account) });
      return el("tr", { "data-testid": "account-row", "data-account": account.name,
        "data-enabled": open ? "yes" : "no" },
        el("td", { class: "mono", text: account.name }),
        el("td", { text: account.kind }),
        el("td", {}, el("span", { class: `switch ${open ? "on" : "off"}`, "data-testid": "account-status",
          text: status })),
        el("td", { "data-testid": "account-reason", text: account.reason || "" }),
        el("td", { class: "muted", text: clock(account.updated_at) }),
        el("td", {}, button));
    }));
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

  function renderJobs() {
    $("jobs-empty").hidden = view.jobs.length > 0;
    $("jobs-body").replaceChildren(...view.jobs.map((job) => {
      const c = job.counts;
      const open = c.pending + c.running > 0;
      return el("tr", { "data-testid": "job-row", "data-job-id": job.id, "data-state": job.state,
        class: job.id === view.selectedJob ? "selected" : "" },
        el("td", {},
          el("button", { type: "button", class: "link", "data-testid": "job-select",
            title: `show the tasks of ${job.id}`, onclick: () => selectJob(job.id) }, job.name),
          el("div", { class: "mono muted", text: short(job.id) })),
        el("td", {}, badge(job.state)),
        el("td", { class: "wide" }, progressBar(c, job.total, "job-progress")),
        ...STATES.map((name) => el("td", { class: `num ${name}`, "data-testid": `job-${name}`,
          text: c[name] })),
        el("td", { class: "actions" },
          el("button", { type: "button", "data-testid": "job-cancel", class: "danger",
            disabled: !open, text: "cancel",
            onclick: (e) => act(e.currentTarget, "POST", `/v1/jobs/${job.id}/cancel`, {},
              (a) => `job ${a.name}: canceling ${a.counts.pending + a.counts.running}`) }),
          el("button", { type: "button", "data-testid": "job-retry", disabled: !c.failed,
            text: "retry failed",
            onclick: (e) => act(e.currentTarget, "POST", `/v1/jobs/${job.id}/retry`, {},
              (a) => `job ${a.name}: retrying failed tasks`) })));
    }));
  }

  function laneOf(task) {
    if (task.account) return `${task.kind}:${task.account}`;
    const serving = view.lanes.filter((lane) => lane.models.includes(task.model));
    if (serving.length === 1) return serving[0].name;
    return `${task.kind}:${task.model} (any account)`;
  }

  function taskRow(task) {
    const lane = laneOf(task);
    let stage = task.state === "running" ? (task.stage || "") : "";
    if (stage && task.progress !== null && task.progress !== undefined) {
      stage += ` ${Math.round(task.progress)}%`;
    }
    if (stage && task.queue_position !== null && task.queue_position !== undefined) {
      stage += ` (queue ${task.queue_position})`;
    }
    if (task.cancel_requested && !TERMINAL.has(task.state)) stage += " · canceling";
    const error = task.error ? `${task.error.kind}: ${task.error.message}` : "";
    const running = task.state === "pending" || task.state === "running";
    return el("tr", { "data-testid": "task-row", "data-task-id": task.id, "data-state": task.state },
      el("td", { class: "mono", title: task.id, text: short(task.id) }),
      el("td", { text: task.model }),
      el("td", { class: "mono", text: lane }),
      el("td", {}, badge(task.state, task.from_cache ? " (cache)" : null)),
      el("td", { "data-testid": "task-stage", text: stage }),
      el("td", { class: "num", "data-testid": "task-attempt", text: `${task.attempt}/${task.max_attempts}` }),
      el("td", { class: "num", "data-testid": "task-ahead", text: task.state === "pending" ? task.ahead : "" }),
      el("td", { class: "num", "data-testid": "task-eta", text: running ? duration(task.eta_s) : "" }),
      el("td", { class: "error", "data-testid": "task-error", title: error, text: error }),
      el("td", { class: "actions" },
        el("button", { type: "button", "data-testid": "task-cancel", class: "danger",
          disabled: !running || task.cancel_requested, text: "cancel",
          onclick: (e) => act(e.currentTarget, "POST", `/v1/tasks/${task.id}/cancel`, {},
            (a) => `task ${short(a.id)}: ${a.state}`) }),
        el("button", { type: "button", "data-testid": "task-retry", disabled: task.state !== "failed",
          text: "retry",
          onclick: (e) => act(e.currentTarget, "POST", `/v1/tasks/${task.id}/retry`, {},
            (a) => `task ${short(a.id)}: attempt ${a.attempt} queued`) })));
  }

  function renderTasks() {
    const job = view.jobs.find((j) => j.id === view.selectedJob);
    $("tasks-title").textContent = view.selectedJob
      ? `Tasks of job ${job ? job.name : short(view.selectedJob)}`
      : "Active tasks";
    $("show-active").hidden = !view.selectedJob;
    $("tasks-empty").hidden = view.tasks.length > 0;
    $("tasks-body").replaceChildren(...view.tasks.map(taskRow));
  }

  // -- start ----------------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("show-active").addEventListener("click", () => selectJob(null));
    refresh();
  });
})();
