// The live view of a web account's browser: the remote login page
// (#login/<account>: frames in, the operator's mouse, keys, wheel and paste
// out, Done / Cancel) and the read-only view of a running web task (a
// section of the task page). Frames arrive as server-sent JPEG (base64);
// positions are sent as fractions of the shown image, so the page never
// needs to know the browser's size.
"use strict";

(() => {
  const D = window.dispatcherDashboard;
  const { $, el } = D;
  const MOVE_EVERY_MS = 80;
  let stream = null; // the one EventSource open at a time
  let streamRoute = null;

  function closeStream() {
    if (stream) stream.close();
    stream = null;
    streamRoute = null;
  }

  // Frames from `url` into `img`; `onEnd(reason)` once the view ends or fails.
  function openStream(url, img, onEnd, route) {
    closeStream();
    const source = new EventSource(url, { withCredentials: true });
    stream = source;
    streamRoute = route;
    let frames = 0;
    source.addEventListener("frame", (event) => {
      const frame = JSON.parse(event.data);
      img.src = `data:image/jpeg;base64,${frame.jpeg}`;
      frames += 1;
      img.dataset.frames = String(frames);
    });
    source.addEventListener("end", () => { closeStream(); onEnd("the browser was closed"); });
    source.onerror = () => {
      // A refused stream (no session, not running) ends at once; a dropped
      // one would be retried by EventSource against a browser that is gone.
      if (source !== stream) return;
      closeStream();
      onEnd("the live view ended");
    };
  }

  function at(img, event) {
    const box = img.getBoundingClientRect();
    const clamp = (v) => Math.min(1, Math.max(0, v));
    return { x: clamp((event.clientX - box.left) / box.width), y: clamp((event.clientY - box.top) / box.height) };
  }

  const BUTTONS = ["left", "middle", "right"];
  const SPECIAL = new Set(["Backspace", "Tab", "Enter", "Escape", "PageUp", "PageDown", "End", "Home",
    "ArrowLeft", "ArrowUp", "ArrowRight", "ArrowDown", "Delete"]);

  // -- the login page ------------------------------------------------------------------------------
  const loginPage = {
    account: null,
    status: null,

    inputPath() { return `/v1/accounts/${encodeURIComponent(this.account)}/login`; },

    send(body) {
      // Input is fire-and-forget: order is kept by one chain of requests.
      this.chain = (this.chain || Promise.resolve()).then(() => D.api("POST", `${this.inputPath()}/input`, body))
        .catch((err) => { if (!(err instanceof D.SignedOut)) this.say(err.message, true); });
      return this.chain;
    },

    say(text, bad) {
      if (this.status) {
        this.status.textContent = text;
        this.status.classList.toggle("error", Boolean(bad));
      }
    },

    enter(route) {
      this.account = route.id;
      this.chain = null;
      this.finishing = false;
      const img = el("img", { class: "screen", alt: "the account's browser", tabindex: "0",
        "data-testid": "login-screen", draggable: "false" });
      this.status = el("p", { class: "muted", "data-testid": "login-status", text: "connecting…" });
      const paste = el("input", { type: "text", placeholder: "paste here to type it into the page",
        "data-testid": "login-paste", autocomplete: "off" });
      const done = el("button", { type: "button", "data-testid": "login-done", text: "Done",
        onclick: (e) => this.finish(e.currentTarget, "done") });
      const cancel = el("button", { type: "button", class: "danger", "data-testid": "login-cancel",
        text: "Cancel", onclick: (e) => this.finish(e.currentTarget, "cancel") });
      const start = el("button", { type: "button", "data-testid": "login-start", text: "open the browser",
        hidden: true, onclick: (e) => this.start(e.currentTarget) });
      this.controls = [done, cancel];
      this.startButton = start;
      this.wire(img, paste);
      $("login-page").replaceChildren(el("section", { "data-testid": "login-view" },
        el("div", { class: "section-head" },
          el("h2", {}, "Log in ", el("span", { class: "mono", text: route.id })),
          el("span", { class: "spacer" }), start, done, cancel),
        el("p", { class: "muted", text: "Click into the page and type as in any browser; "
          + "press Done once the site shows you logged in. Cancel closes it unchanged." }),
        this.status, paste, el("div", { class: "screen-box" }, img)));
      this.connect(img);
    },

    connect(img) {
      this.img = img;
      openStream(`${this.inputPath()}/frames`, img, (why) => {
        if (this.finishing) return; // Done/Cancel say what happened
        this.say(`${why}. No login session is open for this account now.`, false);
        for (const b of this.controls) b.disabled = true;
        this.startButton.hidden = false;
      }, "login");
      this.say("live: the account's browser", false);
    },

    async start(button) {
      const answer = await D.act(button, "POST", this.inputPath(), {}, () => `browser opened for ${this.account}`);
      if (!answer) return;
      button.hidden = true;
      button.disabled = false;
      for (const b of this.controls) b.disabled = false;
      this.connect(this.img);
    },

    async finish(button, what) {
      await this.chain;
      button.disabled = true;
      this.finishing = true;
      try {
        const answer = await D.api("POST", `${this.inputPath()}/${what}`, {});
        closeStream();
        if (what === "done") {
          const queued = answer.requeued.length;
          D.toast(`${this.account} logged in and enabled${queued ? `, ${queued} task(s) queued again` : ""}`);
          this.say("logged in: the browser is closed and the account enabled.", false);
        } else {
          this.say("canceled: the browser is closed, nothing changed.", false);
        }
        for (const b of this.controls) b.disabled = true;
      } catch (err) {
        if (!(err instanceof D.SignedOut)) this.say(err.message, true);
        button.disabled = false;
      } finally {
        this.finishing = false;
      }
    },

    wire(img, paste) {
      let lastMove = 0;
      img.addEventListener("contextmenu", (e) => e.preventDefault());
      img.addEventListener("mousedown", (e) => {
        e.preventDefault();
        const where = at(img, e); // before the focus: it could scroll the image
        img.focus({ preventScroll: true });
        this.send({ type: "mouse", action: "down", button: BUTTONS[e.button] || "left", ...where });
      });
      img.addEventListener("mouseup", (e) => {
        this.send({ type: "mouse", action: "up", button: BUTTONS[e.button] || "left", ...at(img, e) });
      });
      img.addEventListener("mousemove", (e) => {
        const now = Date.now();
        if (now - lastMove < MOVE_EVERY_MS) return;
        lastMove = now;
        this.send({ type: "mouse", action: "move", button: "none", ...at(img, e) });
      });
      img.addEventListener("wheel", (e) => {
        e.preventDefault();
        this.send({ type: "wheel", dx: e.deltaX, dy: e.deltaY, ...at(img, e) });
      }, { passive: false });
      img.addEventListener("keydown", (e) => {
        if (e.ctrlKey || e.metaKey || e.altKey) return; // let the operator's own shortcuts (paste) work
        if (e.key.length === 1 || SPECIAL.has(e.key)) {
          e.preventDefault();
          this.send({ type: "key", key: e.key });
        }
      });
      img.addEventListener("paste", (e) => {
        const text = e.clipboardData ? e.clipboardData.getData("text") : "";
        e.preventDefault();
        if (text) this.send({ type: "text", text });
      });
      paste.addEventListener("change", () => {
        if (paste.value) this.send({ type: "text", text: paste.value });
        paste.value = "";
      });
    },

    load() { return Promise.resolve(); },
    render() {},
  };

  // -- a running task, read-only -----------------------------------------------------------------
  // The task page is rebuilt when the task changes stage: the section (and
  // its stream) outlives those rebuilds.
  let live = { id: null, node: null };
  function liveSection(task) {
    if (task.state !== "running") {
      if (streamRoute === "task") closeStream();
      live = { id: null, node: null };
      return null;
    }
    if (live.id === task.id) return live.node;
    const img = el("img", { class: "screen", alt: "the task's browser", "data-testid": "task-live-screen",
      hidden: true });
    const note = el("span", { class: "muted", "data-testid": "task-live-status" });
    const button = el("button", { type: "button", "data-testid": "task-watch", text: "watch the browser",
      onclick: () => {
        button.disabled = true;
        img.hidden = false;
        note.textContent = "live, read-only";
        openStream(`/v1/tasks/${encodeURIComponent(task.id)}/live`, img, (why) => {
          note.textContent = why;
          button.disabled = false;
        }, "task");
      } });
    const node = el("section", { "data-testid": "task-live" },
      el("div", { class: "section-head" }, el("h3", { text: "Browser" }), button, note),
      el("div", { class: "screen-box" }, img));
    live = { id: task.id, node };
    return node;
  }

  window.addEventListener("hashchange", () => {
    const name = location.hash.replace(/^#/, "").split("/")[0];
    if (stream && name !== streamRoute) closeStream();
  });

  D.pages.login = loginPage;
  D.liveSection = liveSection;
  D.openLogin = async (button, account) => {
    const answer = await D.act(button, "POST", `/v1/accounts/${encodeURIComponent(account.name)}/login`, {},
      () => `browser opened for ${account.name}`);
    if (answer) location.hash = `#login/${account.name}`;
  };
})();
