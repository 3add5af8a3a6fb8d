#!/usr/bin/env bash
# Installs sidejob into a prefix: the binary, the shipped tool plugins where the daemon looks
# for them (<prefix>/lib/sidejob/plugins), shell completions and man pages.
#
#   deploy/install.sh [--prefix DIR] [--from DIR] [--destdir DIR]
#
#   --prefix DIR   where it goes [default: /usr/local]
#   --from DIR     install an existing build (e.g. target/release) instead of building one
#   --destdir DIR  stage under DIR (for packaging); paths inside stay relative to --prefix
#
# `cargo install` can only place binaries, so it cannot install the plugins: use this.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
from=
destdir=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --from) from=$2; shift 2 ;;
        --destdir) destdir=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$from" ]; then
    cargo build --release --locked -p sidejob
    from=target/release
fi

root="$destdir$prefix"
plugins="$root/lib/sidejob/plugins"
# The daemon refuses plugin files and directories that anyone but root (or its own user)
# could write, so everything is installed go-w.
umask 022
install -d -m 0755 "$root/bin" "$plugins" \
    "$root/share/bash-completion/completions" "$root/share/zsh/site-functions" \
    "$root/share/fish/vendor_completions.d" "$root/share/man/man1"
install -m 0755 "$from/sidejob" "$root/bin/sidejob"

for name in bash code subagent; do
    lib="libsidejob_plugin_$name.so"
    # `cargo build` copies a plugin next to the binary; a test build leaves it in deps/.
    src=
    for candidate in "$from/$lib" "$from/deps/$lib"; do
        if [ -f "$candidate" ] && { [ -z "$src" ] || [ "$candidate" -nt "$src" ]; }; then
            src=$candidate
        fi
    done
    if [ -z "$src" ]; then
        echo "install.sh: $lib is not in $from; build with cargo build --release -p sidejob" >&2
        exit 1
    fi
    # A temporary name, then a rename: a running daemon's watcher never sees half a file.
    install -m 0644 "$src" "$plugins/.$lib.tmp"
    mv -f "$plugins/.$lib.tmp" "$plugins/$lib"
done

bin="$root/bin/sidejob"
"$bin" completions bash > "$root/share/bash-completion/completions/sidejob"
"$bin" completions zsh > "$root/share/zsh/site-functions/_sidejob"
"$bin" completions fish > "$root/share/fish/vendor_completions.d/sidejob.fish"
"$bin" man --dir "$root/share/man/man1"

echo "installed sidejob into $root (plugins in $plugins)"
