# The complete checkpoints in a directory, those with their state file (written last), one name a line
# (qwen_tui.run.restarts): sh -c SCRIPT sh DIR. No Python needed on the node; no directory lists nothing.
cd -- "$1" 2>/dev/null || exit 0;
for d in checkpoint-*; do
  if [ -f "$d/finetune_state.json" ] || [ -f "$d/trainer_state.json" ]; then printf "%s\n" "$d"; fi;
done
