#!/usr/bin/env bash
# The table of contents in a header's doc block names its "// >>" section
# markers, in order, and nothing else. Used by CI: tools/check_toc.sh hostir.h hostir_nccl.h
set -u
status=0
for h in "$@"; do
  toc=$(awk '/Table of contents/ {on = 1; next} on && /^ *\/\/ >>/ {print $2; next} on && NF == 0 {exit}' "$h")
  markers=$(grep -E '^// >>' "$h" | awk '{print $2}')
  if [ -z "$toc" ]; then echo "$h: no table of contents"; status=1; continue; fi
  if [ "$toc" != "$markers" ]; then
    echo "$h: the table of contents does not match the section markers:"
    diff <(echo "$toc") <(echo "$markers") | sed 's/^/  /'
    status=1
  fi
done
[ $status -eq 0 ] && echo "table of contents: matches the markers ($*)"
exit $status
