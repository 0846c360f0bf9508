from __future__ import annotations

from pathlib import Path

from kvbench_node_agent.inventory import collect_inventory, disks, nics, rdma_ports


def test_rdma_ports_and_nics_from_a_sysfs_tree(tmp_path: Path) -> None:
    ib = tmp_path / "infiniband"
    for device, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        port = ib / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("Ethernet\n")
    (ib / "mlx5_0" / "device" / "net" / "ens1").mkdir(parents=True)  # the netdev the RDMA port rides on
    found_rdma = {p["device"]: p for p in rdma_ports(str(ib))}
    assert {d: p["state"] for d, p in found_rdma.items()} == {"mlx5_0": "ACTIVE", "mlx5_1": "DOWN"}
    assert found_rdma["mlx5_0"]["netdev"] == "ens1"
    assert found_rdma["mlx5_1"]["netdev"] == ""
    assert found_rdma["mlx5_0"]["rate"] == "400 Gb/sec (4X NDR)"
    assert found_rdma["mlx5_0"]["phys_state"] == "LinkUp"
    net = tmp_path / "net"
    for name, speed in (("lo", "0"), ("ens1", "200000"), ("ens2", "-1")):
        nic = net / name
        nic.mkdir(parents=True)
        for attr, value in (("address", "aa:bb"), ("mtu", "9000"), ("speed", speed), ("operstate", "up")):
            (nic / attr).write_text(value + "\n")
    found = {n["name"]: n for n in nics(str(net))}
    assert set(found) == {"ens1", "ens2"}
    assert found["ens1"]["speed_mbps"] == 200000
    assert found["ens2"]["speed_mbps"] is None
    assert found["ens1"]["mtu"] == 9000


def test_inventory_of_this_machine_lists_disks_and_the_root_mount() -> None:
    inventory = collect_inventory("n0", simulated=False, group="lab", address="10.0.0.9")
    assert inventory.address == "10.0.0.9"
    assert inventory.ram_gb > 0
    assert any(d["mount"] == "/" for d in disks()) or inventory.disks == []
