# The checkpoints in a directory, one a line (qwen_tui.run.restarts): sh -c SCRIPT sh DIR. A whole one by its name;
# one to skip as "# NAME: why". Whole: its state file is there, and so is its manifest (written last,
# training/checkpoints/manifest.py), whose every listed file ("files": one "path": size a line) is there at its size.
# No Python needed on the node; no directory lists nothing.
cd -- "$1" 2>/dev/null || exit 0;
for d in checkpoint-*; do
  [ -d "$d" ] || continue;
  case "$d" in *[!0-9]) continue;; esac;
  if [ ! -f "$d/finetune_state.json" ] && [ ! -f "$d/trainer_state.json" ]; then
    printf '# %s: no finetune_state.json\n' "$d"; continue;
  fi;
  if [ ! -f "$d/manifest.json" ]; then
    printf '# %s: no manifest.json (written last, once every rank'"'"'s part is saved)\n' "$d"; continue;
  fi;
  why=$(awk '/"files": *\{/ { f = 1; next } f && /^ *\}/ { f = 0 }
             f { line = $0; sub(/^ *"/, "", line); sub(/,$/, "", line); n = match(line, /": *[0-9]+$/);
                 if (n) { size = substr(line, n); sub(/^": */, "", size); print size " " substr(line, 1, n - 1) } }' "$d/manifest.json" |
        while read -r size f; do
          if [ ! -f "$d/$f" ]; then echo "$f is missing"; break; fi;
          have=$(wc -c < "$d/$f");
          if [ "$have" -ne "$size" ]; then echo "$f is $have bytes, $size when it was saved"; break; fi;
        done);
  if [ -n "$why" ]; then printf '# %s: %s\n' "$d" "$why"; else printf '%s\n' "$d"; fi;
done
