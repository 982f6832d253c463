// Progressive enhancement only: every page reads and works without it.
// "Select all" on the dead-letter list.
document.querySelectorAll("input.select-all").forEach((box) => {
  box.hidden = false;
  box.addEventListener("change", () => {
    box.closest("form").querySelectorAll('input[name="execution_id"]').forEach((row) => {
      row.checked = box.checked;
    });
  });
});
