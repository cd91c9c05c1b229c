// One job's page (#job/<id>): its counts from the job's light answer, its
// tasks a page at a time, filtered on the service. Helpers come from
// dashboard.js and dashboard-pages.js, loaded first.
"use strict";

(() => {
  const D = window.dispatcherDashboard;
  const { $, el, short, duration, when, bytes, errorText, etaText, itemsOf } = D;
  const { section, notFound, resultUrl, elsewhere, isImage, isVideo, firstLines, MAX_CARDS,
    TEXT_LINES } = D.pageParts;

  // -- one job --------------------------------------------------------------------------------
  // The job's counts come from its light view; its tasks a page at a time,
  // filtered on the service (a job of 10,000 is never read whole).
  const JOB_PAGE = 100;

  const jobPage = {
    id: null,
    job: null,
    tasks: [],
    next: null,
    cursors: [], // the cursors of the pages before this one, for "newer"
    cursor: "",
    filters: { state: "", ref: "" },
    error: null,
    cards: new Map(), // task id -> {signature, node}: finished media is never reloaded

    enter(route) {
      if (route.id === this.id) return;
      this.id = route.id;
      this.job = null;
      this.tasks = [];
      this.next = null;
      this.cursors = [];
      this.cursor = "";
      this.filters = { state: "", ref: "" };
      this.error = null;
      this.cards = new Map();
      $("job-page").replaceChildren(el("p", { class: "muted", text: "loading…" }));
    },

    tasksPath(id) {
      const params = new URLSearchParams({ limit: String(JOB_PAGE) });
      if (this.filters.state) params.set("state", this.filters.state);
      if (this.filters.ref) params.set("ref", this.filters.ref);
      if (this.cursor) params.set("cursor", this.cursor);
      return `/v1/jobs/${encodeURIComponent(id)}/tasks?${params}`;
    },

    async load(route) {
      try {
        const job = await D.api("GET", `/v1/jobs/${encodeURIComponent(route.id)}?tasks=none`);
        const page = await D.api("GET", this.tasksPath(job.id));
        this.job = job;
        this.tasks = itemsOf(page);
        this.next = page.next || null;
        this.error = null;
      } catch (err) {
        if (err instanceof D.SignedOut || err.status === undefined) throw err;
        this.job = null;
        this.error = err.message;
      }
    },

    onTask(task) {
      return this.job !== null && task.job_id === this.job.id;
    },

    go(cursor, back) {
      if (back) this.cursor = this.cursors.pop() || "";
      else if (cursor === "") { this.cursors = []; this.cursor = ""; }
      else { this.cursors.push(this.cursor); this.cursor = cursor; }
      D.scheduleRefresh(0);
    },

    filterForm() {
      const apply = (event) => {
        event.preventDefault();
        const form = new FormData(event.currentTarget);
        this.filters = { state: String(form.get("state") || ""), ref: String(form.get("ref") || "").trim() };
        this.go("");
      };
      return el("form", { class: "filters", "data-testid": "job-filters", onsubmit: apply },
        el("label", {}, "state",
          el("select", { name: "state", "data-testid": "job-filter-state" },
            el("option", { value: "", text: "any" }),
            ...D.STATES.map((s) => el("option", { value: s, text: s })))),
        el("label", { class: "grow" }, "ref",
          el("input", { name: "ref", type: "search", "data-testid": "job-filter-ref",
            autocomplete: "off", maxlength: "200" })),
        el("button", { type: "submit", "data-testid": "job-filter-apply", text: "filter" }));
    },

    render() {
      const job = this.job;
      if (!job) {
        if (this.error !== null) $("job-page").replaceChildren(notFound("Job", this.error));
        return;
      }
      const page = $("job-page");
      if (!page.querySelector("[data-testid=job-gallery]")) {
        page.replaceChildren(
          el("section", { class: "page-head", id: "job-head" }),
          section("Progress per lane", "job-lanes", el("table", {},
            el("thead", {}, el("tr", {}, ...["lane", "progress", ...D.STATES].map((h) =>
              el("th", { class: h === "progress" ? "wide" : "", text: h })))),
            el("tbody", { id: "job-lanes-body" }))),
          section("Results", "job-gallery-section",
            el("p", { class: "muted", id: "job-gallery-note" }),
            el("div", { class: "gallery", id: "job-gallery", "data-testid": "job-gallery" })),
          section("Tasks", "job-tasks", this.filterForm(), el("table", {},
            el("thead", {}, el("tr", {}, ...["task", "model", "lane", "state", "stage", "attempt",
              "ahead", "ETA", "error", ""].map((h) => el("th", { text: h })))),
            el("tbody", { id: "job-tasks-body" })),
          el("p", { class: "muted", id: "job-tasks-empty", "data-testid": "job-tasks-empty",
            text: "No task of this job matches.", hidden: true }),
          el("div", { class: "pager" },
            el("button", { type: "button", id: "job-tasks-newer", "data-testid": "job-tasks-newer",
              text: "← earlier", onclick: () => this.go(null, true) }),
            el("button", { type: "button", id: "job-tasks-older", "data-testid": "job-tasks-older",
              text: "later →", onclick: () => this.go(this.next) }),
            el("span", { class: "muted", id: "job-tasks-count", "data-testid": "job-tasks-count" }))));
      }
      this.renderHead(job);
      this.renderLanes(job);
      this.renderGallery(job);
      $("job-tasks-body").replaceChildren(...this.tasks.map(D.taskRow));
      $("job-tasks-empty").hidden = this.tasks.length > 0;
      $("job-tasks-newer").disabled = this.cursors.length === 0;
      $("job-tasks-older").disabled = !this.next;
      const first = this.cursors.length * JOB_PAGE;
      const filtered = this.filters.state || this.filters.ref;
      $("job-tasks-count").textContent = this.tasks.length
        ? `tasks ${first + 1}–${first + this.tasks.length}${filtered ? " that match" : ""}`
          + ` · ${job.total} in the job` : `${job.total} in the job`;
    },

    renderHead(job) {
      const open = job.counts.pending + job.counts.running > 0;
      $("job-head").replaceChildren(
        el("div", { class: "section-head" },
          el("h2", { "data-testid": "job-title" }, "Job ", el("span", { text: job.name })),
          D.badge(job.state),
          el("span", { class: "mono muted", title: job.id, text: short(job.id) }),
          el("span", { class: "spacer" }),
          ...D.jobActions(job)),
        el("dl", { class: "facts" },
          ...[["created", when(job.created_at)], ["tasks", job.total],
            [open ? "running for" : "took", duration(job.elapsed_s)], ["cost", D.usd(job.cost_usd)],
            ["ETA", job.waiting || (job.eta_s === null || job.eta_s === undefined ? "–" : duration(job.eta_s))]]
            .map(([label, value]) => el("div", { class: "fact" }, el("dt", { text: label }),
              el("dd", { "data-testid": `job-fact-${label.replace(/ /g, "-")}`, text: value })))),
        D.progressBar(job.counts, job.total, "job-progress"));
    },

    renderLanes(job) {
      const lanes = new Map();
      for (const [model, counts] of Object.entries(job.by_model || {})) {
        const serving = D.view.lanes.filter((lane) => !lane.invalid && lane.models.includes(model));
        const name = serving.length === 1 ? serving[0].name : `${model} (any account)`;
        if (!lanes.has(name)) lanes.set(name, Object.fromEntries(D.STATES.map((s) => [s, 0])));
        for (const s of D.STATES) lanes.get(name)[s] += counts[s] || 0;
      }
      $("job-lanes-body").replaceChildren(...[...lanes.entries()].sort().map(([name, counts]) => {
        const total = D.STATES.reduce((sum, s) => sum + counts[s], 0);
        return el("tr", { "data-testid": "job-lane-row", "data-lane": name },
          el("td", { class: "mono", text: name }),
          el("td", { class: "wide" }, D.progressBar(counts, total, "job-lane-progress")),
          ...D.STATES.map((s) => el("td", { class: `num ${s}`, text: counts[s] })));
      }));
    },

    renderGallery(job) {
      const shown = this.tasks.slice(0, MAX_CARDS);
      $("job-gallery-note").textContent = job.total > shown.length
        ? `the tasks of this page of the table below (${shown.length} of ${job.total})` : "";
      const nodes = shown.map((task) => {
        const signature = JSON.stringify([task.state, task.attempt, task.error,
          task.state === "running" ? [task.stage, task.progress, etaText(task).text] : null]);
        const known = this.cards.get(task.id);
        if (known && known.signature === signature) return known.node;
        const node = this.card(task);
        this.cards.set(task.id, { signature, node });
        return node;
      });
      const gallery = $("job-gallery");
      // Moving an existing node does not reload its image.
      nodes.forEach((node, index) => {
        if (gallery.children[index] !== node) gallery.insertBefore(node, gallery.children[index] || null);
      });
      while (gallery.children.length > nodes.length) gallery.lastElementChild.remove();
    },

    thumb(task) {
      if (task.state === "success" && task.result) {
        const files = task.result.files || [];
        const index = files.findIndex((f) => isImage(f) || isVideo(f));
        if (index >= 0 && task.result_on_host) return elsewhere(task, "gallery-elsewhere");
        if (index >= 0) {
          const file = files[index];
          const url = resultUrl(task, index);
          const media = isImage(file)
            ? el("img", { src: url, alt: file.name, loading: "lazy", "data-testid": "gallery-image" })
            : el("video", { src: url, preload: "metadata", muted: true, "data-testid": "gallery-video" });
          const label = isVideo(file) ? el("span", { class: "kind", text: `▶ video · ${bytes(file.size)}` })
            : null;
          return [media, label,
            files.length > 1 ? el("span", { class: "more", text: `+${files.length - 1}` }) : null];
        }
        if (task.result.text) {
          return el("pre", { class: "thumb-text", "data-testid": "gallery-text",
            text: firstLines(task.result.text, TEXT_LINES) });
        }
        if (files.length) return el("span", { class: "muted", text: `${files.length} file(s)` });
        return el("span", { class: "muted", text: "empty answer" });
      }
      if (task.state === "failed") {
        return el("div", { class: "thumb-error", "data-testid": "gallery-error",
          text: errorText(task.error) });
      }
      if (task.state === "canceled") return el("span", { class: "muted", text: "canceled" });
      const eta = etaText(task);
      const status = task.state === "running"
        ? `${task.stage || "running"}${eta.text ? ` · ${eta.text}` : ""}`
        : `waiting${task.ahead ? ` (${task.ahead} ahead)` : ""}`;
      return el("span", { class: `muted${eta.late ? " late" : ""}`, text: status });
    },

    card(task) {
      const open = (event) => {
        if (event.target.closest("button, a")) return;
        location.hash = `#task/${task.id}`;
      };
      return el("div", { class: `card ${task.state}`, "data-testid": "gallery-card",
        "data-task-id": task.id, "data-state": task.state, onclick: open },
        el("div", { class: "thumb" }, this.thumb(task)),
        el("div", { class: "caption" },
          el("div", { class: "who" }, D.taskLink(task),
            el("div", { class: "muted small", text: task.model })),
          D.badge(task.state),
          task.state === "failed"
            ? el("button", { type: "button", "data-testid": "gallery-retry", text: "retry",
              onclick: (e) => D.retryTask(e.currentTarget, task) })
            : null));
    },
  };

  D.pages.job = jobPage;
})();
