#!/usr/bin/env bash
# Install the Debian packages whose commands are missing: apt_missing.sh COMMAND=PACKAGE ...
# One quiet `apt-get update` first, and only when something is missing; sudo when not root.
# Never fatal: a test that needs a command still missing is skipped, with the reason.
set -uo pipefail
missing=()
for pair in "$@"; do
  command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
sudo=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); fi
echo "installing Debian packages: ${missing[*]}" >&2
if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
       && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1; then
  echo "could not install ${missing[*]}: the tests that need them are skipped" >&2
fi
exit 0
