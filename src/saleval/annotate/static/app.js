// Keyboard shortcuts for the answer buttons (1..C for the labels, 0 or ? for
// "I don't know") and a guard against double submission. Served as a file, not
// inline, so the Content-Security-Policy can forbid inline script. The buttons are
// plain submit buttons: without JavaScript the page still works.
"use strict";
(function () {
  var form = document.querySelector("form[data-answer-form]");
  if (!form) return;
  var sent = false;
  form.addEventListener("submit", function (event) {
    if (sent) { event.preventDefault(); return; }
    sent = true;
    form.setAttribute("aria-busy", "true");
  });
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    var target = event.target;
    if (target && target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
    var buttons = form.querySelectorAll("button[data-keys]");
    for (var i = 0; i < buttons.length; i++) {
      var keys = (buttons[i].getAttribute("data-keys") || "").split(" ");
      if (keys.indexOf(event.key) !== -1) {
        event.preventDefault();
        if (!sent) buttons[i].click();
        return;
      }
    }
  });
})();
