#!/usr/bin/env bash
# report.html in a real browser: a small `epo bench --compare` writes a run directory, headless
# Chromium (Debian's `chromium`, which scripts/setup.sh installs) loads its report.html from
# disk, and the test requires
#   - no console message at all (the page has no script; any message, such as "Uncaught ...",
#     is a fault), checked first on a planted page whose error the check must catch;
#   - the DOM Chromium built to hold every section (run, summary, communication, loss,
#     timelines), the header's rows, the chart, the loss plot and its legend, and a timeline per
#     schedule;
#   - a screenshot, left at OUT/report.png (printed at the end) for a person to look at.
# Usage: report_browser_test.sh SOURCE_DIR EPO_BINARY OUT_DIR      (about 15 s)
set -euo pipefail
src=$1
epo=$2
out=$3
chromium=${EPO_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [[ -z $chromium ]]; then
  echo "report_browser_test: chromium not found; scripts/setup.sh installs Debian's chromium" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
fail() {
  echo "report_browser_test: $*" >&2
  exit 1
}

# Loads PAGE headless; its DOM to DOM, Chromium's log (console messages as "CONSOLE") to LOG,
# a screenshot to SHOT when given. A profile of its own, so nothing of $HOME is read or written.
browse() {
  local page=$1 dom=$2 log=$3 shot=${4:-}
  # --no-sandbox: Chromium's sandbox refuses to start as root (CI) and in most containers; the
  # page is one this test wrote.
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$out/profile" --enable-logging=stderr --v=0 --window-size=1200,2700 \
    ${shot:+--screenshot="$shot"} --dump-dom "file://$page" >"$dom" 2>"$log" ||
    fail "chromium failed on $page (log: $log)"
}

# The check must see a script error: a page with one planted.
cat >"$out/planted.html" <<'HTML'
<!DOCTYPE html><html><body><p id="run">x</p><script>not_a_function();</script></body></html>
HTML
browse "$out/planted.html" "$out/planted.dom" "$out/planted.log"
grep -q 'CONSOLE.*Uncaught ReferenceError' "$out/planted.log" ||
  fail "the planted script error was not seen in Chromium's log ($out/planted.log)"

source "$src/scripts/mpi_env.sh"
"$epo" bench --model tiny-moe --num_nodes 2 --gpus_per_node 1 -ep 2 -gb 16 --max_steps 4 \
  --compare --repeats 1 --comm_compute_ratio 8 --out "$out/run" model.hidden_size=64 \
  model.kv_channels=16 model.ffn_hidden_size=128 model.moe_ffn_hidden_size=64 \
  model.seq_length=32 >"$out/bench.log" 2>&1 || {
  cat "$out/bench.log" >&2
  fail "epo bench failed"
}

browse "$out/run/report.html" "$out/report.dom" "$out/report.log" "$out/report.png"
if grep -q 'CONSOLE' "$out/report.log"; then
  grep 'CONSOLE' "$out/report.log" >&2
  fail "report.html logged the console messages above"
fi
grep -q '</html>' "$out/report.dom" || fail "Chromium's DOM of report.html is incomplete"
# Chromium serializes attributes with double quotes.
for id in run summary communication loss timelines run-info comm-chart comm-legend loss-plot \
  loss-legend; do
  grep -q "id=\"$id\"" "$out/report.dom" || fail "report.html has no element id=$id"
done
for row in command commit host CPU 'date (UTC)' schedules dispatcher 'overlap chunks' \
  'paired edges' pipeline micro-batches link; do
  grep -qF "<th>$row</th>" "$out/report.dom" || fail "the header has no row '$row'"
done
plots=$(grep -o 'class="plot"' "$out/report.dom" | wc -l)
[[ $plots -eq 5 ]] || fail "expected 5 plots (chart, loss, 3 timelines), found $plots"
for name in baseline overlap 'overlap+delay_wgrad'; do
  grep -qF "<h3>$name: " "$out/report.dom" || fail "no timeline for $name"
done
[[ $(head -c 8 "$out/report.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  fail "no PNG screenshot at $out/report.png"
echo "report_browser_test: passed; screenshot $out/report.png"
