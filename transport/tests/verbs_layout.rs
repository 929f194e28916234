//! The verbs binding's `#[repr(C)]` declarations against the real `<infiniband/verbs.h>`: a C
//! program compiled against the header prints the size, alignment and every field's offset and
//! size of each struct the binding declares (and the enum values it copies); this test compares
//! them with Rust's `size_of`/`align_of`/`offset_of!`.
//!
//! Needs a C compiler and rdma-core's headers (`libibverbs-dev`). Without them it prints a skip
//! line; with `SKYRIVER_REQUIRE_VERBS_HEADERS=1` (CI) it fails instead.

#[path = "support/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use skyriver_transport::verbs::sys::types::*;

/// One thing to compare: a struct's size and alignment, a field's offset and size, or a constant.
#[derive(Debug)]
enum Check {
    Struct {
        c_type: &'static str,
        size: usize,
        align: usize,
    },
    Field {
        c_type: &'static str,
        c_field: &'static str,
        offset: usize,
        size: usize,
    },
    Const {
        name: &'static str,
        value: i64,
    },
}

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Every field listed for a struct, with the struct's own size and alignment.
macro_rules! layout {
    ($out:ident, $rust:ty, $c:literal { $($f:ident),* $(,)? }) => {
        $out.push(Check::Struct { c_type: $c, size: size_of::<$rust>(), align: align_of::<$rust>() });
        $(
            $out.push(Check::Field {
                c_type: $c,
                c_field: stringify!($f),
                offset: offset_of!($rust, $f),
                size: field_size::<$rust, _>(|s| &s.$f),
            });
        )*
    };
}

macro_rules! consts {
    ($out:ident, $($name:ident),* $(,)?) => {
        $( $out.push(Check::Const { name: stringify!($name), value: $name as i64 }); )*
    };
}

fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    v.push(Check::Struct {
        c_type: "pthread_mutex_t",
        size: size_of::<pthread_mutex_t>(),
        align: align_of::<pthread_mutex_t>(),
    });
    v.push(Check::Struct {
        c_type: "pthread_cond_t",
        size: size_of::<pthread_cond_t>(),
        align: align_of::<pthread_cond_t>(),
    });
    layout!(v, ibv_gid, "union ibv_gid" { raw });
    layout!(v, ibv_context_ops, "struct ibv_context_ops" {
        _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
        _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
        _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
        _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
        _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
        _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
        _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
    });
    layout!(v, ibv_context, "struct ibv_context" {
        device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
    });
    layout!(v, ibv_device_attr, "struct ibv_device_attr" {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
        vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
        max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
        max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
        max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
    });
    layout!(v, ibv_port_attr, "struct ibv_port_attr" {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2,
    });
    layout!(v, ibv_gid_entry, "struct ibv_gid_entry" {
        gid, gid_index, port_num, gid_type, ndev_ifindex,
    });
    layout!(v, ibv_pd, "struct ibv_pd" { context, handle });
    layout!(v, ibv_mw, "struct ibv_mw" { context, pd, rkey, handle });
    v.push(Check::Field {
        c_type: "struct ibv_mw",
        c_field: "type",
        offset: offset_of!(ibv_mw, type_),
        size: 4,
    });
    layout!(v, ibv_mr, "struct ibv_mr" { context, pd, addr, length, handle, lkey, rkey });
    layout!(v, ibv_comp_channel, "struct ibv_comp_channel" { context, fd, refcnt });
    layout!(v, ibv_cq, "struct ibv_cq" {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed,
    });
    layout!(v, ibv_srq, "struct ibv_srq" {
        context, srq_context, pd, handle, mutex, cond, events_completed,
    });
    layout!(v, ibv_qp, "struct ibv_qp" {
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
        cond, events_completed,
    });
    layout!(v, ibv_wc, "struct ibv_wc" {
        wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
        pkey_index, slid, sl, dlid_path_bits,
    });
    layout!(v, ibv_sge, "struct ibv_sge" { addr, length, lkey });
    layout!(v, ibv_send_wr, "struct ibv_send_wr" {
        wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, bind_mw,
    });
    // The members of ibv_send_wr's unions, named by their C paths.
    let wr = offset_of!(ibv_send_wr, wr);
    let bind = offset_of!(ibv_send_wr, bind_mw);
    for (c_field, offset, size) in [
        (
            "qp_type.xrc.remote_srqn",
            offset_of!(ibv_send_wr, qp_type_xrc_remote_srqn),
            4,
        ),
        (
            "wr.rdma.remote_addr",
            wr + offset_of!(ibv_send_wr_rdma, remote_addr),
            8,
        ),
        ("wr.rdma.rkey", wr + offset_of!(ibv_send_wr_rdma, rkey), 4),
        (
            "wr.atomic.remote_addr",
            wr + offset_of!(ibv_send_wr_atomic, remote_addr),
            8,
        ),
        (
            "wr.atomic.compare_add",
            wr + offset_of!(ibv_send_wr_atomic, compare_add),
            8,
        ),
        (
            "wr.atomic.swap",
            wr + offset_of!(ibv_send_wr_atomic, swap),
            8,
        ),
        (
            "wr.atomic.rkey",
            wr + offset_of!(ibv_send_wr_atomic, rkey),
            4,
        ),
        ("bind_mw.mw", bind + offset_of!(ibv_send_wr_bind_mw, mw), 8),
        (
            "bind_mw.rkey",
            bind + offset_of!(ibv_send_wr_bind_mw, rkey),
            4,
        ),
        (
            "bind_mw.bind_info",
            bind + offset_of!(ibv_send_wr_bind_mw, bind_info),
            size_of::<ibv_mw_bind_info>(),
        ),
    ] {
        v.push(Check::Field {
            c_type: "struct ibv_send_wr",
            c_field,
            offset,
            size,
        });
    }
    layout!(v, ibv_mw_bind_info, "struct ibv_mw_bind_info" {
        mr, addr, length, mw_access_flags,
    });
    layout!(v, ibv_recv_wr, "struct ibv_recv_wr" { wr_id, next, sg_list, num_sge });
    layout!(v, ibv_qp_cap, "struct ibv_qp_cap" {
        max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
    });
    layout!(v, ibv_qp_init_attr, "struct ibv_qp_init_attr" {
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
    });
    layout!(v, ibv_srq_attr, "struct ibv_srq_attr" { max_wr, max_sge, srq_limit });
    layout!(v, ibv_srq_init_attr, "struct ibv_srq_init_attr" { srq_context, attr });
    layout!(v, ibv_global_route, "struct ibv_global_route" {
        dgid, flow_label, sgid_index, hop_limit, traffic_class,
    });
    layout!(v, ibv_ah_attr, "struct ibv_ah_attr" {
        grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
    });
    layout!(v, ibv_qp_attr, "struct ibv_qp_attr" {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit,
    });
    consts!(
        v,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_MW_BIND,
        IBV_MW_TYPE_2,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_QPT_RC,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_ERR,
        IBV_QP_STATE,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_WR_SEND,
        IBV_WR_RDMA_READ,
        IBV_SEND_SIGNALED,
        IBV_SEND_INLINE,
        IBV_PORT_ACTIVE,
        IBV_LINK_LAYER_ETHERNET,
        IBV_GID_TYPE_IB,
        IBV_GID_TYPE_ROCE_V1,
        IBV_GID_TYPE_ROCE_V2,
    );
    v
}

/// The C program that prints what the header says, one `key value` line per check.
fn c_program(checks: &[Check]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for check in checks {
        let line = match check {
            Check::Struct { c_type, .. } => {
                format!("printf(\"{c_type} %zu %zu\\n\", sizeof({c_type}), _Alignof({c_type}));")
            }
            Check::Field {
                c_type, c_field, ..
            } => format!(
                "printf(\"{c_type}.{c_field} %zu %zu\\n\", offsetof({c_type}, {c_field}), \
                 sizeof((({c_type} *)0)->{c_field}));"
            ),
            Check::Const { name, .. } => {
                format!("printf(\"{name} %lld 0\\n\", (long long){name});")
            }
        };
        c.push_str(&line);
        c.push('\n');
    }
    c.push_str("return 0;\n}\n");
    c
}

fn key_and_expected(check: &Check) -> (String, (i64, i64)) {
    match check {
        Check::Struct {
            c_type,
            size,
            align,
        } => (c_type.to_string(), (*size as i64, *align as i64)),
        Check::Field {
            c_type,
            c_field,
            offset,
            size,
        } => (
            format!("{c_type}.{c_field}"),
            (*offset as i64, *size as i64),
        ),
        Check::Const { name, value } => (name.to_string(), (*value, 0)),
    }
}

#[test]
fn binding_matches_the_real_verbs_header() {
    let skip = |why: String| {
        skip::skip(
            "binding_matches_the_real_verbs_header",
            &skip::VERBS_HEADERS,
            &why,
        )
    };
    let checks = checks();
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("layout.c");
    let bin = dir.path().join("layout");
    std::fs::write(&src, c_program(&checks)).expect("write the C program");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let compiled = match Command::new(&cc).arg(&src).arg("-o").arg(&bin).output() {
        Ok(out) => out,
        Err(e) => return skip(format!("no C compiler ({cc}: {e})")),
    };
    if !compiled.status.success() {
        let stderr = String::from_utf8_lossy(&compiled.stderr);
        if stderr.contains("infiniband/verbs.h") && stderr.contains("No such file") {
            return skip("<infiniband/verbs.h> not found".to_string());
        }
        panic!("the layout program did not compile:\n{stderr}");
    }
    let out = Command::new(&bin).output().expect("run the layout program");
    assert!(out.status.success(), "layout program failed");
    let printed: BTreeMap<String, (i64, i64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let mut parts = line.rsplitn(3, ' ');
            let b: i64 = parts.next().unwrap().parse().unwrap();
            let a: i64 = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap().to_string(), (a, b))
        })
        .collect();
    let mut mismatches = Vec::new();
    for check in &checks {
        let (key, rust) = key_and_expected(check);
        let c = printed.get(&key).copied();
        if c != Some(rust) {
            mismatches.push(format!("{key}: C says {c:?}, Rust says {rust:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "binding layout differs from <infiniband/verbs.h>:\n{}",
        mismatches.join("\n")
    );
    println!(
        "verbs layout: {} checks (structs, fields, constants) match <infiniband/verbs.h>",
        checks.len()
    );
}
