#!/bin/sh
# The image's entrypoint: runs its arguments (`python -m sink_service ...`), giving the user a passwd
# entry first if it has none.
#
# OpenShift starts a container as an arbitrary uid in group 0 (`docker run --user N:0` does the same),
# a uid the image's /etc/passwd cannot know. The JVM needs a name for it: the JDK takes user.home
# from the entry ("?" without one: Spark stops on "basedir must be absolute: ?/.ivy2.5.2/local") and
# Hadoop's login fails without one ("Invalid UID, could not determine effective user"; no setting or
# environment variable avoids it). nss_wrapper (LD_PRELOAD, inherited by the JVM and the Python
# workers) serves a copy of /etc/passwd with a line for this uid from a temporary directory, so
# /etc/passwd stays read-only and so may the whole root filesystem (deploy/kubernetes).
# NSS_WRAPPER_LIB: the library elsewhere than Debian's libnss-wrapper puts it (the tests' copy in .venv).
set -eu
uid=$(id -u)
if ! getent passwd "$uid" >/dev/null 2>&1; then
  lib=""
  for candidate in "${NSS_WRAPPER_LIB:-}" /usr/lib/*/libnss_wrapper.so /usr/lib/libnss_wrapper.so; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then lib=$candidate; break; fi
  done
  if [ -z "$lib" ]; then
    echo "entrypoint: uid $uid has no passwd entry and libnss_wrapper.so is not installed" \
         "(apt-get install libnss-wrapper); Spark will fail to log in" >&2
  else
    # Under the scratch area's parent (/tmp, the emptyDir on Kubernetes): the only writable place.
    dir=$(mktemp -d "${TMPDIR:-/tmp}/passwd.XXXXXX")
    { cat /etc/passwd; echo "sink-$uid:x:$uid:$(id -g):kafka-parquet-sink:/tmp:/usr/sbin/nologin"; } >"$dir/passwd"
    cat /etc/group >"$dir/group"
    export LD_PRELOAD="$lib${LD_PRELOAD:+ $LD_PRELOAD}" NSS_WRAPPER_PASSWD="$dir/passwd" NSS_WRAPPER_GROUP="$dir/group"
  fi
fi
exec "$@"
