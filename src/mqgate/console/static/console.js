// Every page's script: confirmations, select-all, copy, back, and live figures (charts.js draws
// the charts on the pages that have them).
"use strict";
document.addEventListener("submit", (e) => {
  const form = e.target.closest("form[data-confirm]");
  const button = e.submitter && e.submitter.closest("[data-confirm-click]");
  const question = button ? button.dataset.confirmClick : form && form.dataset.confirm;
  if (question && !window.confirm(question)) e.preventDefault();
});
document.addEventListener("click", (e) => {
  const all = e.target.closest("[data-select-all]");
  if (all) {
    document.querySelectorAll(`input[name="${all.dataset.selectAll}"]`).forEach((box) => { box.checked = all.checked; });
  }
  const copy = e.target.closest("[data-copy]");
  if (copy) navigator.clipboard.writeText(document.querySelector(copy.dataset.copy).textContent.trim());
  const back = e.target.closest("[data-back]");
  if (back && history.length > 1) { e.preventDefault(); history.back(); }
});
// Live parts: an element with data-live-src is fetched again every data-live-every seconds
// (while the tab is visible), with the ETag of the last answer: an unchanged part is a bodiless
// 304, a changed one is swapped in place. [data-live-stamp=<id>] says when it last answered.
// data-live-first: seconds before the first fetch (a part the page does not carry yet: 0).
// A swap fires live:before-swap and live:swapped on the part (charts.js redraws its charts).
document.querySelectorAll("[data-live-src]").forEach((part) => {
  const every = Number(part.dataset.liveEvery || 5) * 1000;
  const first = part.dataset.liveFirst === undefined ? every : Number(part.dataset.liveFirst) * 1000;
  const stamp = document.querySelector(`[data-live-stamp="${part.id}"]`);
  const say = (text) => { if (stamp) stamp.textContent = text; };
  let tag = "";
  let loaded = false;
  const poll = async () => {
    if (!document.hidden) {
      try {
        const answer = await fetch(part.dataset.liveSrc, {
          credentials: "same-origin", cache: "no-store", headers: tag ? { "If-None-Match": tag } : {},
        });
        if (answer.status === 403) { say("not updating: the session ended (reload to sign in)"); return; }
        if (answer.status === 200) {
          tag = answer.headers.get("ETag") || "";
          const html = await answer.text();
          part.dispatchEvent(new CustomEvent("live:before-swap", { bubbles: true }));
          part.innerHTML = html;
          part.dispatchEvent(new CustomEvent("live:swapped", { bubbles: true }));
        }
        if (answer.status === 200 || answer.status === 304) {
          loaded = true;
          say(`updated ${new Date().toISOString().slice(11, 19)} UTC`); // UTC, as every page
        }
        else say(`not updated: the gateway answered ${answer.status}`);
      } catch (err) {
        say("not updated: the gateway does not answer");
      }
    }
    setTimeout(poll, loaded ? every : Math.min(every, 1000)); // not there yet: soon again
  };
  setTimeout(poll, first);
});
// The message browser's tail: new messages of the topic appended as they come (read from the
// log, nothing consumed), from the end of each queue when the page was made.
const tail = document.getElementById("tail-toggle");
if (tail) {
  const rows = document.querySelector("#messages tbody");
  const status = document.getElementById("tail-status");
  let from = tail.dataset.tailFrom;
  let run = 0; // each start gets a number: an old loop ends when it is not the current one
  let seen = 0;
  const step = async (mine) => {
    if (mine !== run) return;
    try {
      const answer = await fetch(`${tail.dataset.tail}&from=${encodeURIComponent(from)}`, {
        credentials: "same-origin", cache: "no-store",
      });
      if (mine !== run) return;
      if (answer.status === 403) { status.textContent = "stopped: the session ended (reload to sign in)"; run += 1; return; }
      if (answer.ok) {
        const found = await answer.json();
        from = found.next;
        if (found.count) {
          const empty = rows.querySelector("[data-empty]");
          if (empty) empty.remove();
          rows.insertAdjacentHTML("beforeend", found.rows);
          while (rows.rows.length > 1000) rows.deleteRow(0);
          seen += found.count;
        }
        status.textContent = `following: ${seen} new since ${tail.dataset.since}`;
      } else {
        status.textContent = `the gateway answered ${answer.status}; trying again`;
      }
    } catch (err) {
      status.textContent = "the gateway does not answer; trying again";
    }
    setTimeout(() => step(mine), 1000);
  };
  tail.addEventListener("click", () => {
    const on = tail.getAttribute("aria-pressed") !== "true";
    tail.setAttribute("aria-pressed", String(on));
    tail.textContent = on ? "Stop following" : "Follow new messages";
    run += 1;
    if (on) {
      if (!tail.dataset.since) {
        tail.dataset.since = new Date().toLocaleTimeString();
        rows.insertAdjacentHTML("beforeend", '<tr class="tail-mark"><td colspan="8">New messages below</td></tr>');
      }
      status.textContent = "following…";
      step(run);
    } else {
      status.textContent = `stopped: ${seen} new shown`;
    }
  });
}
