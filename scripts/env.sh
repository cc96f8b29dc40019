# Sourced by the other scripts: puts cargo on PATH and names the repository root.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
