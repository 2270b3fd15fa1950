# shellcheck shell=bash
# Kept for scripts/lab-faults alone, which goes (with this file, scripts/lab-vm and
# scripts/lab-guest-lib.sh) once its faults are scenario files: the host library is
# lab/lib.sh.
# shellcheck source-path=SCRIPTDIR/.. source=lab/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lab/lib.sh"
