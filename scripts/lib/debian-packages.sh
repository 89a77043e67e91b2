# Sourced by the scripts/setup.d steps that take a server from Debian's packages without installing
# it (50-postgresql.sh, 60-rabbitmq.sh): packages are fetched with `apt-get download` (no root
# needed, nothing installed) and unpacked with `dpkg-deb -x` into the project's cache. The sourcing
# step sets DEB_STEP (its name in messages) and defines `skip REASON` (print, exit 0).
#
#   deb_tools                   true when apt-get, apt-cache and dpkg-deb are all here
#   deb_private_lists WHAT      apt did not know WHAT: read the package lists into $KDS_CACHE/apt
#                               (apt_opts then points every apt call there)
#   deb_missing_libs PKG...     the lib* dependencies of PKGs not installed on this machine
#   deb_unpack DEST PKG...      download PKGs and unpack them all into DEST (replaced as a whole)

apt_opts=()

deb_tools() {
  command -v apt-get >/dev/null && command -v apt-cache >/dev/null && command -v dpkg-deb >/dev/null
}

deb_private_lists() {
  # a machine whose package lists were cleaned (container images are): read the sources' lists
  # into the cache, as any user, without touching the machine's own lists
  local lists="$KDS_CACHE/apt/lists"
  mkdir -p "$lists/partial" "$KDS_CACHE/apt/archives/partial"
  apt_opts=(-o "Dir::State::Lists=$lists" -o "Dir::Cache=$KDS_CACHE/apt" -o "Dir::Cache::archives=$KDS_CACHE/apt/archives"
            -o Debug::NoLocking=true)
  echo "setup($DEB_STEP): apt knows no $1; reading the package lists into $lists" >&2
  apt-get -q "${apt_opts[@]}" update >&2 || skip "apt-get update failed (no network?)"
}

deb_missing_libs() {
  local l
  for l in $(apt-cache "${apt_opts[@]}" depends "$@" | awk '/^ *\|?Depends: lib/ {print $2}' | sort -u); do
    dpkg-query -W -f='${Status}' "$l" 2>/dev/null | grep -q "install ok installed" || echo "$l"
  done
}

deb_unpack() {
  local dest=$1 dl deb
  shift
  dl=$(mktemp -d)
  chmod 755 "$dl"  # apt's _apt user writes the downloads when this runs as root
  echo "setup($DEB_STEP): fetching $* from Debian's packages into $dest" >&2
  if ! (cd "$dl" && apt-get download -q "${apt_opts[@]}" "$@" >&2); then
    rm -rf "$dl"
    skip "apt-get download $* failed (no network?)"
  fi
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$dest.tmp"; done
  rm -rf "$dl" "$dest"
  mv "$dest.tmp" "$dest"
}
