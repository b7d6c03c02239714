// Refreshes the usage page's live part every 2 seconds (same filters), without reloading the page.
(function () {
  var box = document.getElementById("live");
  if (!box) return;
  var src = box.getAttribute("data-src");
  var last = null;
  function tick() {
    fetch(src, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null && html !== last) { last = html; box.innerHTML = html; }
      })
      .catch(function () {})
      .finally(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();
