#!/usr/bin/env bash
# Installs the real services the integration tests drive, from Debian's packages, when they are absent.
# Without root or apt-get it says what is missing and leaves the tests to fail loudly on it.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
# The sharded-agents path (tests/integration/test_fleet_victoriametrics.py): the store and the rule
# evaluator, both from Debian's victoria-metrics package (which also ships vmagent).
if ! command -v victoria-metrics >/dev/null 2>&1 || ! command -v vmalert >/dev/null 2>&1; then
  need+=(victoria-metrics)
fi
# inferwatch top's screens are read from a real terminal (tests/support/terminal.py).
command -v tmux >/dev/null 2>&1 || need+=(tmux)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: missing ${need[*]} and cannot install them (need root and apt-get)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
# The packages' maintainer scripts may start daemons where an init system runs; the tests start their
# own instances on free ports, so stop any system ones.
for svc in prometheus prometheus-alertmanager victoria-metrics; do
  (command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1) || true
done
