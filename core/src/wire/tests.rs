use super::*;
use crate::digest::ContentDigest;
use proptest::prelude::*;

fn samples() -> Vec<PeerMessage> {
    let req = TransferId(0x0102_0304_0506_0708);
    let sizes = ObjectSizes {
        data_size: 100,
        metadata_size: 28,
    };
    vec![
        PeerMessage::FetchRequest {
            req,
            id: ObjectId::from_u64(9),
            eager_limit: 4096,
            max_chunk_bytes: 8000,
        },
        PeerMessage::EagerData {
            header: EagerHeader {
                req,
                sizes,
                digest: ContentDigest(0x1122_3344_5566_7788),
                offset: 28,
            },
            payload: vec![7; 100],
        },
        PeerMessage::Rendezvous {
            req,
            sizes,
            digest: ContentDigest(u64::MAX),
            regions: vec![
                RemoteRegion {
                    addr: 0x1000,
                    len: 64,
                    rkey: 5,
                },
                RemoteRegion {
                    addr: 0x9000,
                    len: 64,
                    rkey: 6,
                },
            ],
            lane_keys: Vec::new(),
            lease_ms: 100,
        },
        PeerMessage::Rendezvous {
            req,
            sizes,
            digest: ContentDigest(u64::MAX),
            regions: vec![RemoteRegion {
                addr: 0x1000,
                len: 128,
                rkey: 0x1207,
            }],
            lane_keys: vec![0x1207, 0x1308, 0x1409],
            lease_ms: 100,
        },
        PeerMessage::Finish { req },
        PeerMessage::NotFound { req },
        PeerMessage::Busy { req },
        PeerMessage::Error {
            req,
            reason: "arena not registered".into(),
        },
        PeerMessage::Redirect {
            req,
            relay: crate::ids::NodeId(7),
            sizes,
            digest: ContentDigest(0x0bad_cafe),
        },
        PeerMessage::RelayProgress {
            req,
            prefix: 1 << 20,
        },
        PeerMessage::Restoring { req },
        PeerMessage::ExtendLease { req },
        PeerMessage::LeaseExtended { req, lease_ms: 250 },
    ]
}

#[test]
fn every_kind_round_trips() {
    for message in samples() {
        let bytes = to_bytes(&message);
        assert_eq!(message_len(&bytes[..HEADER_BYTES]).unwrap(), bytes.len());
        assert_eq!(decode(&bytes).unwrap(), message, "{message}");
    }
}

#[test]
fn eager_encoding_matches_message_encoding() {
    let header = EagerHeader {
        req: TransferId(3),
        sizes: ObjectSizes {
            data_size: 10,
            metadata_size: 0,
        },
        digest: ContentDigest::of(&[1; 10], &[]),
        offset: 0,
    };
    let mut out = Vec::new();
    encode_eager(&header, &[1; 10], &mut out);
    assert_eq!(
        out,
        to_bytes(&PeerMessage::EagerData {
            header,
            payload: vec![1; 10]
        })
    );
}

#[test]
fn truncation_and_trailing_bytes_are_refused() {
    for message in samples() {
        let bytes = to_bytes(&message);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "{message} cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(WireError::Trailing(1)));
    }
}

#[test]
fn bad_fields_are_refused() {
    let mut bytes = to_bytes(&samples()[0]);
    bytes[2] = WIRE_VERSION - 1;
    assert_eq!(
        decode(&bytes),
        Err(WireError::Version {
            got: WIRE_VERSION - 1
        })
    );
    let mut bytes = to_bytes(&samples()[0]);
    bytes[0] = b'X';
    assert!(matches!(decode(&bytes), Err(WireError::BadMagic(_))));
    let mut bytes = to_bytes(&samples()[0]);
    bytes[3] = 99;
    assert_eq!(decode(&bytes), Err(WireError::UnknownKind(99)));

    // Regions that do not add up to the object's size.
    let mismatched = PeerMessage::Rendezvous {
        req: TransferId(1),
        sizes: ObjectSizes {
            data_size: 100,
            metadata_size: 0,
        },
        digest: ContentDigest(1),
        regions: vec![RemoteRegion {
            addr: 0,
            len: 99,
            rkey: 1,
        }],
        lane_keys: Vec::new(),
        lease_ms: 10,
    };
    assert!(matches!(
        decode(&to_bytes(&mismatched)),
        Err(WireError::Invalid {
            field: "regions",
            ..
        })
    ));
    // A chunk past the object's end.
    let past_end = PeerMessage::EagerData {
        header: EagerHeader {
            req: TransferId(1),
            sizes: ObjectSizes {
                data_size: 4,
                metadata_size: 0,
            },
            digest: ContentDigest(1),
            offset: 2,
        },
        payload: vec![0; 3],
    };
    assert!(matches!(
        decode(&to_bytes(&past_end)),
        Err(WireError::Invalid {
            field: "offset",
            ..
        })
    ));
    // A zero lease.
    let zero_lease = PeerMessage::Rendezvous {
        req: TransferId(1),
        sizes: ObjectSizes {
            data_size: 1,
            metadata_size: 0,
        },
        digest: ContentDigest(1),
        regions: vec![RemoteRegion {
            addr: 0,
            len: 1,
            rkey: 1,
        }],
        lane_keys: Vec::new(),
        lease_ms: 0,
    };
    assert!(decode(&to_bytes(&zero_lease)).is_err());
    // Announced length over the limit.
    let mut huge = to_bytes(&samples()[3]);
    huge[4..8].copy_from_slice(&(MAX_MESSAGE_BYTES as u32).to_le_bytes());
    assert!(matches!(decode(&huge), Err(WireError::TooLarge { .. })));
}

#[test]
fn long_reasons_are_cut_on_a_char_boundary() {
    let reason = "é".repeat(MAX_REASON_BYTES);
    let bytes = to_bytes(&PeerMessage::Error {
        req: TransferId(1),
        reason,
    });
    let PeerMessage::Error { reason, .. } = decode(&bytes).unwrap() else {
        panic!("kind changed")
    };
    assert!(reason.len() <= MAX_REASON_BYTES && reason.chars().all(|c| c == 'é'));
}

proptest! {
    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = message_len(&bytes);
    }

    /// Garbage behind a valid header (so the decoder gets past the header checks).
    #[test]
    fn decoding_garbage_bodies_never_panics(kind in 0u8..15, body in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = vec![MAGIC[0], MAGIC[1], WIRE_VERSION, kind];
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&body);
        if let Ok(message) = decode(&bytes) {
            // Whatever decodes re-encodes to the same bytes.
            prop_assert_eq!(to_bytes(&message), bytes);
        }
    }

    /// Flipping any byte of a valid message gives an error or another valid message.
    #[test]
    fn mutated_messages_never_panic(which in 0usize..13, pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = to_bytes(&samples()[which]);
        let at = pos.index(bytes.len());
        bytes[at] = byte;
        let _ = decode(&bytes);
    }
}

#[test]
fn lane_keys_must_be_whole_per_region_and_bounded() {
    let rendezvous = |regions: usize, keys: usize| PeerMessage::Rendezvous {
        req: TransferId(1),
        sizes: ObjectSizes {
            data_size: 64 * regions as u64,
            metadata_size: 0,
        },
        digest: ContentDigest(1),
        regions: (0..regions)
            .map(|i| RemoteRegion {
                addr: 0x1000 * (i as u64 + 1),
                len: 64,
                rkey: 1,
            })
            .collect(),
        lane_keys: (0..keys as u32).collect(),
        lease_ms: 10,
    };
    for (regions, keys) in [(1, 0), (1, 1), (2, 4), (1, MAX_LANE_KEYS)] {
        let message = rendezvous(regions, keys);
        assert_eq!(decode(&to_bytes(&message)).unwrap(), message);
    }
    for (regions, keys) in [(2, 3), (1, MAX_LANE_KEYS + 1)] {
        let error = decode(&to_bytes(&rendezvous(regions, keys))).unwrap_err();
        assert!(
            matches!(
                error,
                WireError::Invalid {
                    field: "lane_keys",
                    ..
                }
            ),
            "{regions} regions, {keys} keys: {error}"
        );
    }
}

#[test]
fn a_relay_progress_past_the_object_size_limit_is_refused() {
    let mut bytes = to_bytes(&PeerMessage::RelayProgress {
        req: TransferId(1),
        prefix: 0,
    });
    let at = bytes.len() - 8;
    bytes[at..].copy_from_slice(&(MAX_OBJECT_BYTES + 1).to_le_bytes());
    assert!(matches!(
        decode(&bytes),
        Err(WireError::Invalid {
            field: "prefix",
            ..
        })
    ));
}

#[test]
fn a_lease_extension_outside_the_lease_limits_is_refused() {
    for lease_ms in [0, MAX_LEASE_MS + 1] {
        let mut bytes = to_bytes(&PeerMessage::LeaseExtended {
            req: TransferId(1),
            lease_ms: 1,
        });
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&lease_ms.to_le_bytes());
        assert!(
            matches!(
                decode(&bytes),
                Err(WireError::Invalid {
                    field: "lease_ms",
                    ..
                })
            ),
            "{lease_ms}"
        );
    }
}
