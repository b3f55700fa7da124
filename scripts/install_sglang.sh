#!/usr/bin/env bash
# The script ships in the package (schedspec/install/install_sglang.sh), where `schedspec install`
# runs it from wherever schedspec is installed; this is its name in a checkout.
exec "$(dirname "$0")/../schedspec/install/install_sglang.sh" "$@"
