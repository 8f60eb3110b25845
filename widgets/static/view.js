// The interactive layer of every minillm view (anywidget ESM; shipped in the package, no CDN).
// Python owns the picture: it recomputes the synced `svg` whenever `values` changes. This file
// only draws the controls described by `controls` and writes the user's choices to `values`.

function makeInput(control) {
  if (control.kind === "select") {
    const select = document.createElement("select");
    for (const [label, value] of control.options) {
      const option = document.createElement("option");
      option.textContent = label;
      option.value = JSON.stringify(value);
      select.appendChild(option);
    }
    return select;
  }
  const range = document.createElement("input");
  range.type = "range";
  range.min = String(control.min);
  range.max = String(control.max);
  range.step = String(control.step ?? 1);
  return range;
}

function readInput(control, input) {
  return control.kind === "select" ? JSON.parse(input.value) : Number(input.value);
}

// A ▶ button that advances a range control to its max, one step per tick (a replay).
function makePlayButton(control, input, commit) {
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "▶";
  button.title = `play ${control.label ?? control.name}`;
  let timer = null;
  const stop = () => {
    clearInterval(timer);
    timer = null;
    button.textContent = "▶";
  };
  button.addEventListener("click", () => {
    if (timer !== null) return stop();
    if (Number(input.value) >= Number(control.max)) commit(Number(control.min));
    button.textContent = "⏸";
    timer = setInterval(() => {
      const next = Number(input.value) + Number(control.step ?? 1);
      if (next > Number(control.max)) return stop();
      commit(next);
    }, 250);
  });
  return { button, stop };
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "minillm-view";
  const bar = document.createElement("div");
  bar.className = "minillm-controls";
  const picture = document.createElement("div");
  picture.className = "minillm-picture";
  root.append(bar, picture);
  el.appendChild(root);
  let inputs = [];
  let players = [];

  function showValues() {
    const values = model.get("values");
    for (const { control, input, output } of inputs) {
      const value = values[control.name];
      if (value === undefined) continue;
      input.value = control.kind === "select" ? JSON.stringify(value) : String(value);
      if (output) output.textContent = String(value);
    }
  }

  function buildControls() {
    bar.replaceChildren();
    players.forEach((p) => p.stop());
    inputs = [];
    players = [];
    for (const control of model.get("controls")) {
      const label = document.createElement("label");
      label.textContent = `${control.label ?? control.name} `;
      const input = makeInput(control);
      const output = control.kind === "select" ? null : document.createElement("output");
      const commit = (value) => {
        input.value = String(value);
        if (output) output.textContent = String(value);
        model.set("values", { ...model.get("values"), [control.name]: value });
        model.save_changes();
      };
      input.addEventListener("input", () => commit(readInput(control, input)));
      if (control.play) {
        const player = makePlayButton(control, input, commit);
        players.push(player);
        label.appendChild(player.button);
      }
      label.appendChild(input);
      if (output) label.appendChild(output);
      bar.appendChild(label);
      inputs.push({ control, input, output });
    }
    showValues();
  }

  function showPicture() {
    picture.innerHTML = model.get("svg");
  }

  buildControls();
  showPicture();
  model.on("change:svg", showPicture);
  model.on("change:values", showValues);
  model.on("change:controls", buildControls);
  return () => {
    players.forEach((p) => p.stop());
    model.off("change:svg", showPicture);
    model.off("change:values", showValues);
    model.off("change:controls", buildControls);
  };
}

export default { render };
