#!/usr/bin/env bash
# Compares the machine code (SASS) of every kernel in two builds, kernel by kernel: the check that a
# refactoring left every kernel's code byte-identical (no GPU needed).
#
#   sass_compare.sh BASE NEW [RENAMES]
#
# BASE, NEW: a CUDA object, cubin or shared library, or a folder searched for *.o (kernels are
# matched by name across all of a side's files, so moving an instantiation to another translation
# unit does not matter). RENAMES: an optional sed script applied to NEW's kernel names, for a renamed
# type or namespace (which changes a mangled name only); an anonymous namespace's name, which holds a
# hash of the source's path, is compared without it. Each kernel's body is compared with the
# instruction addresses stripped (the encodings stay: branch targets are relative); duplicate
# instantiations on one side must agree. (Only instruction lines count, their blanks collapsed:
# cuobjdump pads a section's last function with lines of dots and aligns the encodings by its
# longest instruction.) Prints one line a kernel that differs or is on one side only
# (instruction counts and registers from cuobjdump -res-usage for those that differ) and a summary;
# exit status 0 when every kernel of both sides is identical.
set -euo pipefail
# (cuobjdump: the toolkit's, else the copy Triton's wheel ships)
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || python3 -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))')}
[[ $# -ge 2 ]] || { sed -n '2,15p' "$0"; exit 2; }
base=$1 new=$2 renames=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# side DIR INPUT [RENAMES]: DIR/<sha1 of name>.sass for each kernel, DIR/index (sha1 name), DIR/regs.
dump() {
  local dir=$1 input=$2 ren=${3:-} files
  mkdir -p "$dir"
  if [[ -d $input ]]; then files=$(find "$input" -name '*.o' | sort); else files=$input; fi
  for f in $files; do
    { "$CUOBJDUMP" -sass "$f" 2>/dev/null || true; } | awk -v dir="$dir" -v ren="$ren" '
      function flush() { if (name != "") { close(out) } }
      /^[ \t]*Function : / {
        flush(); name = $3; gsub(/_GLOBAL__N__[0-9a-f]+_/, "_GLOBAL__N__", name)
        if (ren != "") { cmd = "printf %s \"" name "\" | sed -f " ren; cmd | getline name; close(cmd) }
        cmd = "printf %s \"" name "\" | sha1sum"; cmd | getline h; close(cmd); split(h, parts, " ")
        out = dir "/" parts[1] ".tmp"; printf "" > out
        print parts[1], name >> (dir "/index"); next }
      /^[ \t]*\.section|^[ \t]*Fatbin|^[ \t]*code for|^[ \t]*=+$|^[ \t]*(arch|code version|host|compile_size) =/ { flush(); name = ""; next }
      name != "" && /\/\* 0x[0-9a-f]+ \*\// { sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, ""); gsub(/[ \t]+/, " "); print >> out }'
    for t in "$dir"/*.tmp; do
      [[ -e $t ]] || continue
      local s=${t%.tmp}.sass
      if [[ -e $s ]] && ! cmp -s "$s" "$t"; then echo "warning: $(basename "$s" .sass) differs between two files of $input" >&2; fi
      mv "$t" "$s"
    done
    { "$CUOBJDUMP" -res-usage "$f" 2>/dev/null || true; } | awk -v ren="$ren" '
      /Function / { name = $2; sub(/:$/, "", name); gsub(/_GLOBAL__N__[0-9a-f]+_/, "_GLOBAL__N__", name)
        if (ren != "") { cmd = "printf %s \"" name "\" | sed -f " ren; cmd | getline name; close(cmd) } next }
      /REG:/ && name != "" { r = ""; for (i = 1; i <= NF; ++i) if ($i ~ /^(REG|LOCAL):/) r = r (r == "" ? "" : ",") $i; print name, r; name = "" }' >> "$dir/regs"
  done
  sort -u -o "$dir/index" "$dir/index"
  sort -u -o "$dir/regs" "$dir/regs"
}

dump "$work/base" "$base"
dump "$work/new" "$new" "$renames"
same=0 differ=0 only_base=0 only_new=0
regs() { awk -v n="$2" '$1 == n { print $2; exit }' "$1/regs"; }
count() { grep -c ';' "$1" || true; }
while read -r h name; do
  if [[ ! -e $work/new/$h.sass ]]; then echo "only in BASE: $name"; only_base=$((only_base + 1)); continue; fi
  if cmp -s "$work/base/$h.sass" "$work/new/$h.sass"; then
    same=$((same + 1))
  else
    differ=$((differ + 1))
    echo "differs: $name: instructions $(count "$work/base/$h.sass") -> $(count "$work/new/$h.sass"), $(regs "$work/base" "$name") -> $(regs "$work/new" "$name")"
  fi
done < "$work/base/index"
while read -r h name; do
  [[ -e $work/base/$h.sass ]] || { echo "only in NEW: $name"; only_new=$((only_new + 1)); }
done < "$work/new/index"
echo "kernels: $same identical, $differ differ, $only_base only in BASE, $only_new only in NEW"
[[ $differ -eq 0 && $only_base -eq 0 && $only_new -eq 0 ]]
