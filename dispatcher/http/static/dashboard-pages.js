// The dashboard's pages beyond the overview: one task (#task/<id>), one job
// (#job/<id>), and the history (#history/jobs, #history/tasks). Helpers
// come from dashboard.js (window.dispatcherDashboard), loaded first.
//
// Works with both shapes of the service's answers: lists as plain arrays or
// as {"items", "next"} pages; tasks with or without `attempts` and `ref`.
"use strict";

(() => {
  const D = window.dispatcherDashboard;
  const { $, el, short, duration, when, bytes, errorText, etaText, elapsed, itemsOf } = D;
  const HISTORY_PAGE = 50;
  const MAX_LIST = 500;
  const TEXT_LINES = 4;
  // A gallery of thousands would load thousands of thumbnails at once.
  const MAX_CARDS = 240;

  function resultUrl(task, index) {
    return `/v1/tasks/${encodeURIComponent(task.id)}/result?file=${index}`;
  }

  function artifactUrl(task, attempt, name) {
    return `/v1/tasks/${encodeURIComponent(task.id)}/artifacts/${attempt}/${encodeURIComponent(name)}`;
  }

  // Another host's result files: this host cannot serve them (no shared
  // results dir), so say where they are instead of loading a broken image.
  function elsewhere(task, testid) {
    return el("p", { class: "muted", "data-testid": testid,
      text: `on host ${task.result_on_host}: open its dashboard (or give every host one shared results dir)` });
  }

  function isImage(file) { return String(file.content_type || "").startsWith("image/"); }
  function isVideo(file) { return String(file.content_type || "").startsWith("video/"); }

  function firstLines(text, lines) {
    return String(text || "").split("\n").slice(0, lines).join("\n");
  }

  function section(title, testid, ...children) {
    return el("section", { "data-testid": testid }, el("h3", { text: title }), ...children);
  }

  function notFound(what, message) {
    return el("section", { class: "signed-out", "data-testid": "page-error" },
      el("h2", { text: `${what} not found` }), el("p", { class: "muted", text: message }),
      el("p", {}, el("a", { href: "#", text: "back to the overview" })));
  }

  // -- one task -------------------------------------------------------------------------------
  const taskPage = {
    id: null,
    task: null,
    error: null,
    signature: null,

    enter(route) {
      if (route.id === this.id) return;
      this.id = route.id;
      this.task = null;
      this.error = null;
      this.signature = null;
      $("task-page").replaceChildren(el("p", { class: "muted", text: "loading…" }));
    },

    async load(route) {
      try {
        this.task = await D.api("GET", `/v1/tasks/${encodeURIComponent(route.id)}`);
        this.error = null;
      } catch (err) {
        if (err instanceof D.SignedOut || err.status === undefined) throw err;
        this.task = null;
        this.error = err.message;
      }
    },

    onTask(task) {
      return this.task !== null && task.id === this.task.id;
    },

    render() {
      const task = this.task;
      if (!task) {
        if (this.error !== null) $("task-page").replaceChildren(notFound("Task", this.error));
        return;
      }
      // Only the clock moves: update those texts, keep the media (no reload, no flicker).
      const signature = JSON.stringify([task.state, task.attempt, task.stage, task.cancel_requested,
        task.error, task.artifacts, (task.attempts || []).length, task.result && task.result.files]);
      if (signature === this.signature) {
        this.updateClock(task);
        return;
      }
      this.signature = signature;
      const parts = [
        this.head(task),
        task.error && task.state !== "success" ? this.errorBox(task) : null,
        this.request(task),
        task.kind === "web" && D.liveSection ? D.liveSection(task) : null,
        this.result(task),
        this.attempts(task),
      ];
      $("task-page").replaceChildren(...parts.filter(Boolean));
      this.updateClock(task);
    },

    updateClock(task) {
      // Progress and the running node change without a new stage: updated in place.
      const stageNode = document.querySelector("#task-page [data-testid=task-stage-fact]");
      if (stageNode) stageNode.textContent = D.stageText(task) || "–";
      const eta = etaText(task);
      const etaNode = document.querySelector("#task-page [data-testid=task-eta]");
      if (etaNode) {
        etaNode.textContent = eta.text || "–";
        etaNode.classList.toggle("late", eta.late);
      }
      const took = document.querySelector("#task-page [data-testid=task-elapsed]");
      if (took) {
        const runs = Math.max(task.attempt, (task.attempts || []).length);
        took.textContent = duration(elapsed(task)) + (runs > 1 ? ` over ${runs} attempts` : "");
      }
    },

    head(task) {
      const running = task.state === "pending" || task.state === "running";
      const fact = (label, value, testid) => el("div", { class: "fact" }, el("dt", { text: label }),
        el("dd", { "data-testid": testid || null }, value === "" || value === null ? "–" : value));
      return el("section", { class: "page-head", "data-testid": "task-head" },
        el("div", { class: "section-head" },
          el("h2", {}, "Task ", el("span", { class: "mono", title: task.id, text: short(task.id) }),
            task.ref ? el("span", { class: "ref", "data-testid": "task-ref", text: task.ref }) : null),
          D.badge(task.state, task.from_cache ? " (cache)" : null),
          el("span", { class: "spacer" }),
          el("button", { type: "button", class: "danger", "data-testid": "task-cancel",
            disabled: !running || task.cancel_requested, text: "cancel",
            onclick: (e) => D.cancelTask(e.currentTarget, task) }),
          el("button", { type: "button", "data-testid": "task-retry", disabled: task.state !== "failed",
            text: "retry", onclick: (e) => D.retryTask(e.currentTarget, task) })),
        el("dl", { class: "facts" },
          fact("model", task.model, "task-model"),
          fact("lane", D.laneOf(task), "task-lane"),
          fact("host", task.host || "", "task-host"),
          fact("job", task.job_id
            ? el("a", { href: `#job/${task.job_id}`, class: "mono", text: short(task.job_id) })
            : "none (single task)", "task-job"),
          fact("ref", task.ref || "", "task-ref-fact"),
          fact("created", when(task.created_at)),
          fact("started", when(task.started_at)),
          fact("finished", when(task.finished_at)),
          fact("took", "", "task-elapsed"),
          fact("attempt", `${task.attempt} of ${task.max_attempts}`, "task-attempt"),
          fact("stage", "", "task-stage-fact"),
          fact("ETA", "", "task-eta"),
          fact("id", el("span", { class: "mono", text: task.id }))));
    },

    errorBox(task) {
      const retrying = task.state === "pending" || task.state === "running";
      return el("section", { class: "error-box", "data-testid": "task-failure" },
        el("strong", { text: retrying ? "The last attempt failed; it will be retried. " : "Failed: " }),
        el("span", { class: "mono", text: errorText(task.error) }));
    },

    request(task) {
      const params = { ...(task.params || {}) };
      const prompt = params.prompt;
      delete params.prompt;
      const rows = Object.entries(params).map(([key, value]) => el("tr", {},
        el("th", { class: "mono", text: key }),
        el("td", { class: "mono wrap", text: typeof value === "string" ? value : JSON.stringify(value) })));
      return section("Prompt and parameters", "task-request",
        prompt !== undefined
          ? el("pre", { class: "prompt", "data-testid": "task-prompt", text: String(prompt) })
          : el("p", { class: "muted", text: "no prompt" }),
        rows.length ? el("table", { class: "params", "data-testid": "task-params" }, el("tbody", {}, rows))
          : null,
        task.force ? el("p", { class: "muted", text: "forced: de-duplication and cache bypassed" }) : null);
    },

    result(task) {
      if (task.state !== "success" || !task.result) {
        const why = task.state === "failed" || task.state === "canceled" ? `no result: ${task.state}`
          : "no result yet";
        return section("Result", "task-result", el("p", { class: "muted", text: why }));
      }
      const files = task.result.files || [];
      const away = Boolean(task.result_on_host);
      const shown = files.map((file, index) => {
        const url = resultUrl(task, index);
        let media = null;
        if (away) {
          media = elsewhere(task, "result-elsewhere");
        } else if (isImage(file)) {
          media = el("a", { href: url, target: "_blank", rel: "noopener" },
            el("img", { src: url, alt: file.name, class: "result-media", "data-testid": "result-image" }));
        } else if (isVideo(file)) {
          media = el("video", { src: url, controls: true, preload: "metadata", class: "result-media",
            "data-testid": "result-video" });
        }
        return el("figure", { class: "result-file", "data-testid": "result-file" }, media,
          el("figcaption", {},
            el("span", { class: "mono", text: file.name }), " · ",
            el("span", { "data-testid": "result-size", text: bytes(file.size) }), " · ",
            el("span", { class: "muted", text: file.content_type }), " ",
            away ? null : el("a", { href: url, download: file.name, "data-testid": "result-download",
              text: "download" })));
      });
      const text = task.result.text;
      return section("Result", "task-result",
        ...shown,
        text ? el("pre", { class: "answer", "data-testid": "result-text", text }) : null,
        !text && !files.length ? el("p", { class: "muted", text: "the model answered nothing" }) : null);
    },

    // Each attempt: the service's history of ended attempts when it sends one,
    // the current attempt from the task itself, and any attempt that left artifacts.
    attemptList(task) {
      const rows = new Map();
      const history = Array.isArray(task.attempts) ? task.attempts : [];
      history.forEach((a, i) => {
        const n = a.attempt ?? a.number ?? i + 1;
        rows.set(n, {
          n,
          state: a.outcome ?? a.state ?? null,
          owner: a.owner ?? null,
          lane: a.lane ?? null,
          started: a.started_at ?? null,
          ended: a.ended_at ?? a.finished_at ?? null,
          stages: a.stage_durations ?? a.stage_timings ?? null,
          error: a.error ?? null,
        });
      });
      const current = task.attempt;
      // Without a history, a task waiting for its retry still carries the last error.
      const erredBefore = !history.length && task.state === "pending" && task.error && current > 1;
      // A pending task's times belong to an earlier attempt: its current one has not run.
      if (!rows.has(current) && task.state !== "pending") {
        rows.set(current, { n: current, state: task.state, owner: task.owner,
          started: task.started_at, ended: task.finished_at, stages: task.stage_durations,
          error: erredBefore ? null : task.error });
      }
      if (erredBefore && !rows.has(current - 1)) {
        rows.set(current - 1, { n: current - 1, state: "failed", error: task.error });
      }
      for (const n of Object.keys(task.artifacts || {}).map(Number)) {
        if (!rows.has(n)) rows.set(n, { n });
      }
      return [...rows.values()].sort((a, b) => a.n - b.n);
    },

    // An attempt that ended with the task going back to pending was retried (or re-queued).
    outcome(a) {
      if (!a.state) return "";
      if (a.state === "pending") {
        return el("span", { class: `state ${a.error ? "failed" : "pending"}`, "data-testid": "state",
          text: a.error ? "failed, retried" : "re-queued" });
      }
      return D.badge(a.state);
    },

    // The screenshot as a thumbnail, and a link to each thing the attempt left behind.
    evidence(task, n) {
      const items = (task.artifacts || {})[String(n)] || [];
      if (!items.length) return null;
      const labels = { screenshot: "screenshot", html: "page HTML (as text)",
        trace: "Playwright trace", answer: "vendor's last answer" };
      const hints = { trace: "open with: playwright show-trace <file>",
        html: "the page's HTML when it went wrong, shown as plain text" };
      const shot = items.find((item) => item.kind === "screenshot");
      return el("div", { class: "evidence" },
        shot ? el("a", { href: artifactUrl(task, n, shot.name), target: "_blank", rel: "noopener" },
          el("img", { src: artifactUrl(task, n, shot.name), alt: `screenshot of attempt ${n}`,
            class: "evidence-shot", "data-testid": "evidence-shot" })) : null,
        el("ul", {}, items.map((item) => el("li", {},
          el("a", { href: artifactUrl(task, n, item.name), target: "_blank", rel: "noopener",
            title: hints[item.kind] || null, "data-testid": `artifact-${item.kind}`,
            download: item.kind === "trace" ? item.name : null,
            text: labels[item.kind] || item.name }),
          el("span", { class: "muted", text: ` ${bytes(item.size)}` })))));
    },

    attempts(task) {
      const list = this.attemptList(task);
      if (!list.length) return section("Attempts", "task-attempts", el("p", { class: "muted", text: "not started yet" }));
      const stageText = (stages) => Object.entries(stages || {})
        .map(([name, s]) => `${name} ${s < 10 ? s.toFixed(1) : Math.round(s)}s`).join(" · ");
      return section("Attempts", "task-attempts",
        el("table", {},
          el("thead", {}, el("tr", {}, ...["#", "outcome", "owner", "started", "ended", "took",
            "stages", "error", "what it looked like"].map((h) => el("th", { text: h })))),
          el("tbody", {}, list.map((a) => el("tr", { "data-testid": "attempt-row", "data-attempt": a.n },
            el("td", { class: "num", text: a.n }),
            el("td", {}, this.outcome(a)),
            el("td", { class: "mono", text: a.owner || a.lane || "" }),
            el("td", { class: "muted", text: when(a.started) }),
            el("td", { class: "muted", text: when(a.ended) }),
            el("td", { class: "num", text: a.started && a.ended ? duration(a.ended - a.started) : "" }),
            el("td", { class: "muted small", text: stageText(a.stages) }),
            a.error
              ? el("td", { class: "error", "data-testid": "attempt-error", text: errorText(a.error) })
              : el("td", { class: "muted", "data-testid": "attempt-error",
                text: a.state ? "" : "earlier attempt (no details kept)" }),
            el("td", { class: "evidence-cell", "data-testid": "attempt-evidence" },
              this.evidence(task, a.n)))))));
    },
  };

  // -- history ------------------------------------------------------------------------------------
  const TASK_STATES = ["pending", "running", "success", "failed", "canceled"];
  const JOB_STATES = ["running", "success", "failed", "canceled", "partial"];

  const historyPage = {
    tab: "tasks",
    filters: { state: "", model: "", q: "" },
    items: [],
    next: null,
    legacyLimit: HISTORY_PAGE, // today's service answers arrays: we ask for more instead
    legacy: false,
    stale: true,
    wired: false,

    enter(route) {
      if (!this.wired) this.wire();
      if (route.id !== this.tab) this.filters = { state: "", model: "", q: "" };
      this.tab = route.id;
      for (const link of document.querySelectorAll("[data-tab]")) {
        link.classList.toggle("current", link.dataset.tab === this.tab);
      }
      const form = $("history-filters");
      const states = this.tab === "jobs" ? JOB_STATES : TASK_STATES;
      form.elements.state.replaceChildren(el("option", { value: "", text: "any" }),
        ...states.map((s) => el("option", { value: s, text: s })));
      form.elements.state.value = this.filters.state;
      form.elements.q.value = this.filters.q;
      for (const node of form.querySelectorAll("[data-only]")) node.hidden = node.dataset.only !== this.tab;
      this.reset();
    },

    wire() {
      this.wired = true;
      $("history-filters").addEventListener("submit", (event) => {
        event.preventDefault();
        const form = event.currentTarget;
        this.filters = { state: form.elements.state.value, model: form.elements.model.value,
          q: form.elements.q.value.trim() };
        this.reset();
        D.scheduleRefresh(0);
      });
      for (const name of ["state", "model"]) {
        $("history-filters").elements[name].addEventListener("change", () => {
          $("history-filters").requestSubmit();
        });
      }
      $("history-more").addEventListener("click", () => this.more());
    },

    reset() {
      this.items = [];
      this.next = null;
      this.legacyLimit = HISTORY_PAGE;
      this.stale = true;
    },

    query(after, limit) {
      const params = new URLSearchParams({ limit: String(limit) });
      const f = this.filters;
      if (this.tab === "tasks") params.set("state", f.state || TASK_STATES.join(","));
      else if (f.state) params.set("state", f.state);
      if (this.tab === "tasks" && f.model) params.set("model", f.model);
      if (f.q) params.set("q", f.q);
      if (after) params.set("after", after);
      return `/v1/${this.tab}?${params}`;
    },

    // Today's service filters tasks by state only and jobs not at all: the rest is done here.
    matches(item) {
      const f = this.filters;
      if (f.state && item.state !== f.state) return false;
      if (this.tab === "tasks" && f.model && item.model !== f.model) return false;
      if (!f.q) return true;
      const q = f.q.toLowerCase();
      const fields = this.tab === "jobs" ? [item.name, item.id]
        : [item.id, item.ref, item.model, item.job_id, item.params && item.params.prompt];
      return fields.some((v) => v && String(v).toLowerCase().includes(q));
    },

    async fetchPage(after) {
      const limit = after ? HISTORY_PAGE : this.legacyLimit;
      const answer = await D.api("GET", this.query(after, limit));
      this.legacy = Array.isArray(answer);
      if (this.legacy) {
        const all = answer;
        this.items = all.filter((item) => this.matches(item))
          .sort((a, b) => b.created_at - a.created_at);
        this.next = all.length >= limit && limit < MAX_LIST ? "more" : null;
      } else {
        this.items = after ? this.items.concat(answer.items) : answer.items;
        this.next = answer.next || null;
      }
    },

    async load() {
      if (!this.stale) return;
      this.stale = false;
      await this.fetchPage(null);
    },

    async more() {
      const button = $("history-more");
      button.disabled = true;
      try {
        if (this.legacy) {
          this.legacyLimit = Math.min(MAX_LIST, this.legacyLimit + HISTORY_PAGE);
          await this.fetchPage(null);
        } else {
          await this.fetchPage(this.next);
        }
        this.render();
      } catch (err) {
        if (!(err instanceof D.SignedOut)) D.toast(err.message, true);
      } finally {
        button.disabled = false;
      }
    },

    fillModels() {
      const select = $("history-filters").elements.model;
      const models = [...new Set(D.view.lanes.flatMap((lane) => lane.models))].sort();
      if (select.options.length === models.length + 1) return;
      select.replaceChildren(el("option", { value: "", text: "any" }),
        ...models.map((m) => el("option", { value: m, text: m })));
      select.value = this.filters.model;
    },

    onTask(task) {
      const index = this.items.findIndex((t) => t.id === task.id);
      if (this.tab === "tasks" && index >= 0) {
        this.items[index] = { ...this.items[index], ...task };
        const row = document.querySelector(`#history-body tr[data-task-id="${CSS.escape(task.id)}"]`);
        if (row) row.replaceWith(this.taskRow(this.items[index]));
      }
      return false;
    },

    taskRow(task) {
      const prompt = task.params && typeof task.params.prompt === "string" ? task.params.prompt : "";
      const took = elapsed(task);
      return el("tr", { "data-testid": "history-task-row", "data-task-id": task.id,
        "data-state": task.state, class: "clickable",
        onclick: (event) => { if (!event.target.closest("a, button")) location.hash = `#task/${task.id}`; } },
        el("td", { class: "muted", "data-testid": "history-created", text: when(task.created_at) }),
        el("td", {}, D.taskLink(task, short(task.id))),
        el("td", { class: "mono", text: task.ref || "" }),
        el("td", {}, task.job_id
          ? el("a", { href: `#job/${task.job_id}`, class: "mono", text: short(task.job_id) })
          : el("span", { class: "muted", text: "single" })),
        el("td", { text: task.model }),
        el("td", {}, D.badge(task.state, task.from_cache ? " (cache)" : null)),
        el("td", { class: "num", text: `${task.attempt}/${task.max_attempts}` }),
        el("td", { class: "num", text: took === null ? "" : duration(took) }),
        el("td", { class: "prompt-cell", title: prompt, text: firstLines(prompt, 1) }),
        el("td", { class: "error", text: errorText(task.error) }));
    },

    render() {
      this.fillModels();
      const heads = this.tab === "jobs"
        ? ["job", "state", "created", "progress", ...D.STATES, ""]
        : ["created", "task", "ref", "job", "model", "state", "attempt", "took", "prompt", "error"];
      $("history-head").replaceChildren(el("tr", {}, ...heads.map((h) =>
        el("th", { class: h === "progress" ? "wide" : "", text: h }))));
      const rows = this.items.map((item) => (this.tab === "jobs" ? D.jobRow(item) : this.taskRow(item)));
      $("history-body").replaceChildren(...rows);
      $("history-empty").hidden = rows.length > 0;
      $("history-more").hidden = !this.next;
      $("history-count").textContent = `${rows.length} ${this.tab} shown, newest first`;
    },
  };

  // For dashboard-job.js, loaded next.
  D.pageParts = { section, notFound, resultUrl, elsewhere, isImage, isVideo, firstLines, MAX_CARDS,
    TEXT_LINES };
  D.pages.task = taskPage;
  D.pages.history = historyPage;
})();
