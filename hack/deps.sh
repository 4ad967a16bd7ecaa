#!/usr/bin/env bash
# Installs the Debian packages cni-usernet's demo, tests and benchmark use,
# when any is missing. Idempotent; needs root and apt.
set -euo pipefail
pkgs=(iproute2 ethtool iputils-ping curl util-linux python3 nftables iperf3
      redis-server redis-tools nginx-light apache2-utils python3-matplotlib
      hping3 passt slirp4netns tcpdump iptables)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts these on install; our tests start their own instances.
for svc in redis-server nginx; do
  service "$svc" stop >/dev/null 2>&1 || true
done
