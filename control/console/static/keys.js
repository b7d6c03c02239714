// Keys page: copy buttons, and a confirmation before a key is revoked.
document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button.copy");
  if (!b) return;
  const text = document.getElementById(b.dataset.copy).textContent;
  // the words come from the page (data-copied, data-copy-failed on <main>), in its language
  const words = document.querySelector("main").dataset;
  navigator.clipboard.writeText(text).then(() => { b.textContent = words.copied; },
                                           () => { b.textContent = words.copyFailed; });
});
document.addEventListener("submit", (ev) => {
  const f = ev.target.closest("form[data-confirm]");
  if (f && !window.confirm(f.dataset.confirm)) ev.preventDefault();
});
