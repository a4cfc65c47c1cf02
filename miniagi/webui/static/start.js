// What is typed in the start form is kept in this tab until it is started: a reload (after `miniagi setup`, say)
// does not lose it.
(function () {
  const objective = document.querySelector("form#start textarea[name=objective]");
  if (!objective) return;
  const key = "miniagi-objective";
  if (!objective.value && sessionStorage.getItem(key)) objective.value = sessionStorage.getItem(key);
  objective.addEventListener("input", () => sessionStorage.setItem(key, objective.value));
  objective.form.addEventListener("submit", () => sessionStorage.removeItem(key));
})();
