#!/usr/bin/env bash
# Provisioning of the Vagrant VM (see ../../Vagrantfile), as root in the guest:
# the CI's build and rxe packages, Rust for root, and a systemd unit that runs
# rxe-up.sh at every boot (rxe0/rxe1 on a veth pair, rxe2 on the NIC with IP $1).
set -euo pipefail
REPO=/vagrant
NIC_IP=${1:-}
export DEBIAN_FRONTEND=noninteractive

apt-get update
apt-get install -y --no-install-recommends ca-certificates curl git
"$REPO/ci/softroce/install-deps.sh" build
"$REPO/ci/softroce/install-deps.sh" rxe
modinfo rdma_rxe > /dev/null   # the kernel must ship SoftRoCE

if [ ! -x /root/.cargo/bin/cargo ]; then
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --default-toolchain stable --component clippy,rustfmt
fi

cat > /etc/systemd/system/skyriver-rxe.service <<UNIT
[Unit]
Description=SoftRoCE devices for Skyriver's verbs tests (rxe0/rxe1 on a veth pair, rxe2 on the NIC)
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$REPO/ci/softroce/rxe-up.sh $NIC_IP

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now skyriver-rxe.service
rdma link show
echo "ready: vagrant ssh -c 'sudo -i $REPO/ci/softroce/test.sh --here'"
