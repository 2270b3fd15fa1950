# shellcheck shell=bash
# Kept for scripts/lab-guest-faults alone (see scripts/lab-lib.sh): the guests' library
# is lab/guest/lib.sh.
# shellcheck source-path=SCRIPTDIR/.. source=lab/guest/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lab/guest/lib.sh"
