// Keys page: copy buttons, and a confirmation before a key is revoked.
document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button.copy");
  if (!b) return;
  const text = document.getElementById(b.dataset.copy).textContent;
  navigator.clipboard.writeText(text).then(() => { b.textContent = "Copied"; },
                                           () => { b.textContent = "Select and copy"; });
});
document.addEventListener("submit", (ev) => {
  const f = ev.target.closest("form[data-confirm]");
  if (f && !window.confirm(f.dataset.confirm)) ev.preventDefault();
});
