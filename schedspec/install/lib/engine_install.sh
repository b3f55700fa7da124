# Sourced by install_vllm.sh and install_sglang.sh (schedspec/install/; scripts/ in a checkout): install one engine's
# scheduler into a venv with --no-deps and only the packages its scheduler imports, held
# to the engine's own pins, then probe it. The caller sets, then calls `install_engine "$@"`:
#   SCRIPT            the script's name, for messages (install_vllm.sh)
#   DIST, VERSION     the engine's distribution and pinned version (sglang, 0.5.23)
#   TORCH_VERSION     the torch the venv keeps (its CPU build if it has none)
#   OVERRIDDEN        the engine's pins the venv does not follow (its CUDA torch's)
#   RUNTIME_PACKAGES  what building and stepping its scheduler imports
#   NO_DEPS           DIST, then packages installed at DIST's pin with --no-deps
#   EXTRA_PINS        pins DIST's METADATA does not give (may be empty)
#   PROBE_ENGINE      the engine's name for the probe, `python -m $PROBE_MODULE $PROBE_ENGINE`
#                     (vllm), which must pass for the install to be done
#   PROBE_WHAT        what the probe builds, for messages
# An engine whose adapter runs several releases sets, instead of VERSION:
#   SUPPORTED_VERSIONS  those releases, oldest first. The script then takes `--version X`
#                       (or VERSION=X from the environment; the flag wins), installs the
#                       newest by default, and refuses any other version naming the
#                       range, unless `--any-version` (scripts/try_newest_vllm.sh): then
#                       ANY_VERSION_VARIABLE=1 is exported, which the adapter reads as
#                       "run it anyway".
#   ANY_VERSION_VARIABLE  that variable's name
#   release_packages    optional function: given VERSION, it may change RUNTIME_PACKAGES
#                       (a release whose scheduler imports other packages)
# `--no-probe` skips the last step, the probe (the caller runs it: try_newest_vllm.sh).
# Steps (each named when it fails; rerun keeps finished ones): a venv that already has
# DIST==VERSION, torch TORCH_VERSION, trimmed METADATA, schedspec's own dependencies and
# passes the probe (unless --no-probe) needs nothing;
# else torch (install_torch_cpu.sh), DIST --no-deps, a constraints file from DIST's
# Requires-Dist (lib/dist_requirements.py) plus EXTRA_PINS, RUNTIME_PACKAGES under
# it, the other NO_DEPS at their pins with --no-deps, schedspec itself if its own
# dependencies are not all installed, the NO_DEPS' METADATA trimmed of what is left out on purpose
# (pip check then quiet about them), and the probe.
# Needs HERE (the folder of the install scripts) and lib/pip_install.sh sourced.
#
# The scripts run from a checkout (scripts/ names them) or from an installed schedspec
# (`schedspec install`). In a checkout (CHECKOUT below) the probe imports schedspec from
# it, so it tests the adapter next to the script, and schedspec's own dependencies are
# pyproject.toml's, installed with `pip install -e CHECKOUT` where missing. Outside one,
# the venv must have schedspec installed already: there is no source to install it from.

CHECKOUT=$(cd "$HERE/../.." && pwd)
[[ -f $CHECKOUT/pyproject.toml && -f $CHECKOUT/schedspec/__init__.py ]] || CHECKOUT=""

# The one probe runner (schedspec/properties/probe.py): it builds and steps every config
# family the engine's adapter declares, with empty per-user caches; exit status 0 when
# all of them work, 1 (naming the family) when one does not.
PROBE_MODULE=schedspec.properties.probe
# Unset unless the caller runs several releases (its value replaces this one).
SUPPORTED_VERSIONS=()

die() {
    echo "$SCRIPT: error: $*" >&2
    exit 1
}

# Sets VENV, VERSION (for an engine with SUPPORTED_VERSIONS), ANY_VERSION and NO_PROBE from
# the command line; a bad one dies with the usage before anything is touched.
parse_command_line() {
    local several=0
    [[ ${#SUPPORTED_VERSIONS[@]} -gt 0 ]] && several=1
    local usage="usage: scripts/$SCRIPT VENV_DIR"
    ((several)) && usage="usage: scripts/$SCRIPT [--version X] VENV_DIR"
    local version=${VERSION:-}
    VENV="" ANY_VERSION=0 NO_PROBE=0
    while [[ $# -gt 0 ]]; do
        case $1 in
        --version)
            ((several)) && [[ $# -ge 2 ]] || die "$usage"
            version=$2
            shift
            ;;
        --version=*) ((several)) && version=${1#--version=} || die "$usage" ;;
        --any-version) ((several)) && ANY_VERSION=1 || die "$usage" ;;
        --no-probe) NO_PROBE=1 ;;
        -*) die "$usage" ;;
        *) [[ -z $VENV ]] && VENV=$1 || die "$usage" ;;
        esac
        shift
    done
    [[ -n $VENV ]] || die "$usage"
    ((several)) || return 0
    VERSION=${version:-${SUPPORTED_VERSIONS[-1]}}
    local supported
    for supported in "${SUPPORTED_VERSIONS[@]}"; do
        [[ $VERSION == "$supported" ]] && return 0
    done
    local range="${SUPPORTED_VERSIONS[0]} to ${SUPPORTED_VERSIONS[-1]}"
    if ((ANY_VERSION)); then
        echo "$SCRIPT: $DIST $VERSION is outside the supported range ($range); installing it anyway (--any-version)"
        export "$ANY_VERSION_VARIABLE=1"
        return 0
    fi
    die "$DIST $VERSION is not supported; schedspec supports $range (--version: one of ${SUPPORTED_VERSIONS[*]}; --any-version installs another one anyway, as scripts/try_newest_vllm.sh does)"
}

# "torch" if the venv lacks torch $TORCH_VERSION (any build), else "$DIST" if it lacks
# $DIST $VERSION, else nothing.
missing_version() {
    "$PY" - "$DIST" "$VERSION" "$TORCH_VERSION" <<'PYTHON'
import importlib.metadata as md
import sys


def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "none"


dist, wanted, torch_wanted = sys.argv[1:]
if version("torch").split("+")[0] != torch_wanted:
    print("torch")
elif version(dist) != wanted:
    print(dist)
PYTHON
}

# Whether every one of schedspec's own dependencies (pyproject.toml's [project]
# dependencies in a checkout, else the installed schedspec's) is installed in the venv:
# the probe imports only some of them, and `schedspec check` all (Hypothesis, once, was
# missing and only the check found out). Outside a checkout, a venv without schedspec
# has none of them.
schedspec_dependencies_installed() {
    "$PY" - "${CHECKOUT:+$CHECKOUT/pyproject.toml}" <<'PYTHON'
import importlib.metadata as md
import re
import sys
import tomllib

if sys.argv[1]:
    with open(sys.argv[1], "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
else:
    try:
        required = md.requires("schedspec") or []
    except md.PackageNotFoundError:
        sys.exit(1)
    dependencies = [r for r in required if "extra ==" not in r]
for dependency in dependencies:
    name = re.match(r"[A-Za-z0-9_.-]+", dependency)
    try:
        md.version(name.group() if name else dependency)
    except md.PackageNotFoundError:
        sys.exit(1)
PYTHON
}

in_checkout() {
    if [[ -n $CHECKOUT ]]; then
        PYTHONPATH="$CHECKOUT${PYTHONPATH:+:$PYTHONPATH}" "$@"
    else
        "$@"
    fi
}

probe() {
    in_checkout "$PY" -m "$PROBE_MODULE" "$PROBE_ENGINE"
}

trimmed() {
    local dist
    for dist in "${NO_DEPS[@]}"; do
        "$PY" "$HERE/lib/dist_requirements.py" is-trimmed "$dist" 2>/dev/null || return 1
    done
}

# What `pip check` says about NO_DEPS' own requirements (nothing when all are met).
engine_conflicts() {
    "$PY" -m pip --disable-pip-version-check check 2>&1 | grep -E "^($(
        IFS='|'
        echo "${NO_DEPS[*]}"
    )) " || true
}

install_engine() {
    parse_command_line "$@"
    if declare -F release_packages >/dev/null; then
        release_packages "$VERSION"
    fi
    STEP="start"
    trap 'echo "$SCRIPT: error: step \"$STEP\" failed (see the output above); fix that and rerun: finished steps are kept" >&2' ERR
    # What pip's resolver says about NO_DEPS until their METADATA is trimmed.
    PIP_EXPECTED=("^($(
        IFS='|'
        echo "${NO_DEPS[*]}"
    )) [0-9.]+ requires " "^ERROR: pip's dependency resolver")

    if [[ ! -x "$VENV/bin/python" ]]; then
        STEP="create the venv $VENV"
        command -v python3 >/dev/null || die "python3 not found: it is needed to create $VENV"
        python3 -m venv "$VENV"
    fi
    PY="$VENV/bin/python"
    # Outside a checkout there is no source to install schedspec from: say so before
    # anything is downloaded.
    if [[ -z $CHECKOUT ]] && ! schedspec_dependencies_installed; then
        die "schedspec is not installed in $VENV (or lacks its dependencies): install it there first ($VENV/bin/pip install, from where you installed schedspec), then run \`$VENV/bin/schedspec install $PROBE_ENGINE\`"
    fi

    if [[ -z $(missing_version) ]] && trimmed && schedspec_dependencies_installed &&
        { ((NO_PROBE)) || probe >/dev/null 2>&1; }; then
        echo "$SCRIPT: $DIST==$VERSION already works in $VENV; nothing to do"
        exit 0
    fi

    if [[ $(missing_version) == torch ]]; then
        STEP="torch==$TORCH_VERSION (CPU build)"
        echo "== $STEP"
        bash "$HERE/install_torch_cpu.sh" "$VENV"
    fi

    STEP="$DIST==$VERSION --no-deps"
    echo "== $STEP"
    pip_install -q --no-deps "$DIST==$VERSION"

    STEP="constraints from $DIST's Requires-Dist"
    CONSTRAINTS=$(mktemp)
    trap 'rm -f "$CONSTRAINTS"' EXIT
    pip_install -q packaging # what dist_requirements.py parses requirements with
    "$PY" "$HERE/lib/dist_requirements.py" constraints "$DIST" \
        --overridden "${OVERRIDDEN[@]}" >"$CONSTRAINTS"
    local pin
    for pin in "${EXTRA_PINS[@]}"; do
        echo "$pin" >>"$CONSTRAINTS"
    done
    echo "== constraints: $(wc -l <"$CONSTRAINTS") pins ($DIST $VERSION's METADATA${EXTRA_PINS[*]:+, and ${EXTRA_PINS[*]}})"

    STEP="the scheduler's runtime packages, under $DIST's pins"
    echo "== $STEP"
    pip_install -q -c "$CONSTRAINTS" "${RUNTIME_PACKAGES[@]}"

    local dist
    for dist in "${NO_DEPS[@]:1}"; do
        pin=$(grep -i "^$dist" "$CONSTRAINTS" || true)
        [[ -n $pin ]] || die "$DIST $VERSION's METADATA pins no $dist version"
        STEP="$pin --no-deps"
        echo "== $STEP"
        pip_install -q --no-deps "$pin"
    done

    if ! schedspec_dependencies_installed || ! in_checkout "$PY" -c "import $PROBE_MODULE" 2>/dev/null; then
        STEP="schedspec's own dependencies (pip install -e $CHECKOUT)"
        echo "== $STEP"
        pip_install -q -c "$CONSTRAINTS" -e "$CHECKOUT"
    fi

    STEP="trim the METADATA of ${NO_DEPS[*]} (installed with --no-deps)"
    echo "== $STEP"
    for dist in "${NO_DEPS[@]}"; do
        "$PY" "$HERE/lib/dist_requirements.py" trim "$dist" --overridden "${OVERRIDDEN[@]}"
    done
    local conflicts
    conflicts=$(engine_conflicts)
    if [[ -n $conflicts ]]; then
        # A package the venv had before (the test extra brings python-dateutil, say) that
        # DIST pins differently: nothing above asked for it, so pip left it as it was.
        # Bring each under DIST's pin, then check again.
        local wanted=()
        mapfile -t wanted < <(sed -nE 's/^[^ ]+ [^ ]+ has requirement ([^,]+), but you have .*/\1/p' <<<"$conflicts")
        if [[ ${#wanted[@]} -gt 0 ]]; then
            STEP="packages already in $VENV, brought under $DIST's pins: ${wanted[*]}"
            echo "== $STEP"
            pip_install -q -c "$CONSTRAINTS" "${wanted[@]}"
            conflicts=$(engine_conflicts)
        fi
    fi
    [[ -z $conflicts ]] || die "pip check still finds unmet requirements of ${NO_DEPS[*]}:
$conflicts"

    if ((NO_PROBE)); then
        echo "$SCRIPT: $DIST==$VERSION installed in $VENV (not probed: --no-probe)"
        return 0
    fi
    STEP="probe: build and step $PROBE_WHAT per config family, with empty caches"
    echo "== $STEP"
    local output
    if ! output=$(probe 2>&1); then
        echo "$output" >&2
        die "$DIST $VERSION is installed in $VENV but the probe cannot build or step $PROBE_WHAT (above)"
    fi
    echo "$output"
    echo "$SCRIPT: $DIST==$VERSION ready in $VENV"
}
