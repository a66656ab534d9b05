// The console's only script: confirmations, select-all, copy, back, and live figures.
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
// Parts marked data-live are fetched again every 5 s and swapped in place.
const live = document.querySelectorAll("[data-live]");
if (live.length) {
  setInterval(async () => {
    if (document.hidden) return;
    const answer = await fetch(location.href, { credentials: "same-origin" });
    if (!answer.ok) return;
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    live.forEach((part) => {
      const next = fresh.querySelector(`[data-live="${part.dataset.live}"]`);
      if (next) part.innerHTML = next.innerHTML;
    });
  }, 5000);
}
