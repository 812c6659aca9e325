# Appends lines to a file under ~/.ssh (private) unless present (qwen_tui.nodes.keys): sh -c SCRIPT sh NAME
# LINE... Lines travel as arguments, never inside the script. Prints how many lines were added.
# Exit 90: no ~/.ssh; 91: the file cannot be made; 92: it cannot be written.
umask 077; mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh" || exit 90;
f="$HOME/.ssh/$1"; shift; touch "$f" || exit 91; n=0;
for line in "$@"; do
  if ! grep -qxF -- "$line" "$f"; then
    [ -s "$f" ] && [ -n "$(tail -c1 "$f")" ] && echo >>"$f";
    printf "%s\n" "$line" >>"$f" || exit 92; n=$((n+1));
  fi;
done; echo "$n"
