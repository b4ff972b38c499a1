#!/usr/bin/env bash
# The steps of launch/gpu/all.sh on the build tree as it is (no build): for a warm machine whose
# build-gpu/ a previous all.sh or build.sh left. Same environment and steps as all.sh.
# Usage: [STEPS="forward ctest_gpu"] bash launch/gpu/run.sh
exec env SKIP_BUILD=1 bash "$(dirname "$0")/all.sh" "$@"
