//! Unit tests of the layout module: configs, both layouts, and the descriptor format.

use super::config::align_up;
use super::descriptor::VERSION;
use super::*;
use proptest::prelude::*;

/// One layer of a block: 4 tokens × 10 elements × 2 bytes = 80 bytes; a block 240.
fn config() -> LayoutConfig {
    LayoutConfig {
        num_layers: 3,
        page_size: 4,
        inner_dim: 10,
        dtype: DType::F16,
        alignment: 64,
    }
}

fn region(base_addr: u64, len: u64) -> Region {
    Region {
        memory_type: MemoryType::Pinned,
        device_id: 0,
        base_addr,
        len,
    }
}

fn three_layer_regions() -> Vec<Region> {
    vec![
        region(0x10000, 512),
        region(0x40000, 512),
        region(0x20000, 512),
    ]
}

fn fully_contiguous() -> FullyContiguous {
    FullyContiguous::new(config(), 5, region(0x1000, 1280)).unwrap()
}

fn layer_separate() -> LayerSeparate {
    LayerSeparate::new(config(), 4, three_layer_regions()).unwrap()
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

#[test]
fn dtype_sizes_are_bytes_per_element() {
    let sizes = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Fp8E4M3,
        DType::I8,
    ]
    .map(DType::size_bytes);
    assert_eq!(sizes, [4, 2, 2, 1, 1]);
}

#[test]
fn llama_3_8b_holds_128_kib_of_kv_per_token_and_2_mib_per_16_token_block() {
    let per_token = LayoutConfig::for_model(32, 1, 8, 128, DType::BF16).unwrap();
    assert_eq!(per_token.block_bytes(), Ok(131_072));
    let config = LayoutConfig::for_model(32, 16, 8, 128, DType::BF16).unwrap();
    assert_eq!(config.inner_dim, 2048);
    assert_eq!(config.alignment, 256);
    assert_eq!(config.layer_bytes(), Ok(65_536));
    assert_eq!(config.block_bytes(), Ok(2 << 20));
    assert_eq!(FullyContiguous::required_bytes(&config, 10), Ok(20 << 20));
}

#[test]
fn for_model_rejects_an_inner_dim_that_overflows_u32() {
    assert_eq!(
        LayoutConfig::for_model(32, 16, 1 << 16, 1 << 16, DType::BF16),
        Err(LayoutError::Overflow {
            quantity: "inner_dim"
        })
    );
}

#[test]
fn validate_names_each_zero_field() {
    for field in ["num_layers", "page_size", "inner_dim", "alignment"] {
        let mut zeroed = config();
        match field {
            "num_layers" => zeroed.num_layers = 0,
            "page_size" => zeroed.page_size = 0,
            "inner_dim" => zeroed.inner_dim = 0,
            _ => zeroed.alignment = 0,
        }
        assert_eq!(zeroed.validate(), Err(LayoutError::Zero { field }));
    }
}

#[test]
fn validate_rejects_alignment_that_is_not_a_power_of_two() {
    let bad = LayoutConfig {
        alignment: 48,
        ..config()
    };
    assert_eq!(bad.validate(), Err(LayoutError::AlignmentNotPowerOfTwo(48)));
    let one = LayoutConfig {
        alignment: 1,
        ..config()
    };
    assert_eq!(one.validate(), Ok(()));
}

#[test]
fn validate_rejects_byte_sizes_that_overflow_u64() {
    let huge_layer = LayoutConfig {
        page_size: u32::MAX,
        inner_dim: u32::MAX,
        dtype: DType::F32,
        ..config()
    };
    assert_eq!(
        huge_layer.validate(),
        Err(LayoutError::Overflow {
            quantity: "layer bytes"
        })
    );
    let huge_block = LayoutConfig {
        num_layers: u32::MAX,
        page_size: u32::MAX,
        inner_dim: 2,
        dtype: DType::F32,
        alignment: 1,
    };
    assert_eq!(
        huge_block.validate(),
        Err(LayoutError::Overflow {
            quantity: "block bytes"
        })
    );
    // The payload fits exactly, but rounding it up to the alignment does not.
    let unaligned_max = LayoutConfig {
        // 257 × 42_009_217 × 1_708_606_335 = 2^64 - 1, which is odd.
        num_layers: 257,
        page_size: 42_009_217,
        inner_dim: 1_708_606_335,
        dtype: DType::I8,
        alignment: 2,
    };
    assert_eq!(unaligned_max.block_bytes(), Ok(u64::MAX));
    assert_eq!(
        unaligned_max.validate(),
        Err(LayoutError::Overflow {
            quantity: "block stride"
        })
    );
}

#[test]
fn fully_contiguous_block_stride_is_aligned_up() {
    // 3 layers × 80 bytes = 240, rounded up to 64 bytes: 256.
    let layout = fully_contiguous();
    assert_eq!(layout.block_stride_bytes(), 256);
    assert_eq!(layout.layer_stride_bytes(), Some(80));
    assert_eq!(layout.total_bytes(), 1280);
    assert_eq!(FullyContiguous::required_bytes(&config(), 5), Ok(1280));
    assert_eq!(
        layout.offset(2, 1),
        Ok(Address {
            addr: 0x1000 + 2 * 256 + 80,
            len: 80
        })
    );
    assert_eq!(
        layout.offset(4, 2),
        Ok(Address {
            addr: 0x1000 + 4 * 256 + 2 * 80,
            len: 80
        })
    );
}

#[test]
fn fully_contiguous_packs_blocks_tightly_with_alignment_one() {
    let config = LayoutConfig {
        alignment: 1,
        ..config()
    };
    let layout = FullyContiguous::new(config, 2, region(7, 480)).unwrap();
    assert_eq!(layout.block_stride_bytes(), 240);
    assert_eq!(layout.offset(1, 0), Ok(Address { addr: 247, len: 80 }));
}

#[test]
fn fully_contiguous_rejects_a_bad_region() {
    assert_eq!(
        FullyContiguous::new(config(), 5, region(0x1000, 1279)),
        Err(LayoutError::RegionTooSmall {
            region: 0,
            needed: 1280,
            len: 1279
        })
    );
    assert_eq!(
        FullyContiguous::new(config(), 1, region(0x1020, 256)),
        Err(LayoutError::MisalignedBase {
            region: 0,
            base_addr: 0x1020,
            alignment: 64
        })
    );
    assert_eq!(
        FullyContiguous::new(config(), 1, region(u64::MAX - 63, 256)),
        Err(LayoutError::Overflow {
            quantity: "region end"
        })
    );
    assert_eq!(
        FullyContiguous::new(config(), usize::MAX, region(0, u64::MAX)),
        Err(LayoutError::Overflow {
            quantity: "required bytes"
        })
    );
}

#[test]
fn layer_separate_places_blocks_at_the_aligned_layer_size() {
    // One layer of a block is 80 bytes, rounded up to 64 bytes: 128.
    let layout = layer_separate();
    assert_eq!(layout.block_stride_bytes(), 128);
    assert_eq!(layout.layer_stride_bytes(), None);
    assert_eq!(layout.total_bytes(), 3 * 512);
    assert_eq!(
        LayerSeparate::required_bytes_per_region(&config(), 4),
        Ok(512)
    );
    // Layer 1 lives in the region at 0x40000: regions need not be in address order.
    assert_eq!(
        layout.offset(3, 1),
        Ok(Address {
            addr: 0x40000 + 3 * 128,
            len: 80
        })
    );
    assert_eq!(
        layout.offset(0, 2),
        Ok(Address {
            addr: 0x20000,
            len: 80
        })
    );
}

#[test]
fn layer_separate_rejects_inconsistent_regions() {
    assert_eq!(
        LayerSeparate::new(config(), 4, vec![region(0, 512)]),
        Err(LayoutError::RegionCount {
            expected: 3,
            got: 1
        })
    );
    let mut mixed = three_layer_regions();
    mixed[2].memory_type = MemoryType::Device;
    assert_eq!(
        LayerSeparate::new(config(), 4, mixed),
        Err(LayoutError::MixedRegions { region: 2 })
    );
    let mut other_device = three_layer_regions();
    other_device[1].device_id = 1;
    assert_eq!(
        LayerSeparate::new(config(), 4, other_device),
        Err(LayoutError::MixedRegions { region: 1 })
    );
    let mut overlapping = three_layer_regions();
    overlapping[2].base_addr = 0x40000 + 448;
    assert_eq!(
        LayerSeparate::new(config(), 4, overlapping),
        Err(LayoutError::OverlappingRegions {
            first: 1,
            second: 2
        })
    );
    let mut small = three_layer_regions();
    small[1].len = 511;
    assert_eq!(
        LayerSeparate::new(config(), 4, small),
        Err(LayoutError::RegionTooSmall {
            region: 1,
            needed: 512,
            len: 511
        })
    );
    let mut misaligned = three_layer_regions();
    misaligned[0].base_addr += 32;
    assert_eq!(
        LayerSeparate::new(config(), 4, misaligned),
        Err(LayoutError::MisalignedBase {
            region: 0,
            base_addr: 0x10020,
            alignment: 64
        })
    );
}

#[test]
fn adjacent_and_empty_layer_regions_are_not_overlapping() {
    let adjacent = vec![region(0, 512), region(512, 512), region(1024, 512)];
    assert!(LayerSeparate::new(config(), 4, adjacent).is_ok());
    let empty_inside = vec![region(0, 512), region(128, 0), region(1024, 0)];
    assert!(LayerSeparate::new(config(), 0, empty_inside).is_ok());
}

#[test]
fn offsets_past_the_last_block_or_layer_are_errors() {
    let layouts = [
        AnyLayout::from(fully_contiguous()),
        AnyLayout::from(layer_separate()),
    ];
    for layout in &layouts {
        let num_blocks = layout.num_blocks();
        assert_eq!(
            layout.offset(num_blocks, 0),
            Err(LayoutError::BlockOutOfRange {
                block: num_blocks,
                num_blocks
            })
        );
        assert_eq!(
            layout.offset(0, 3),
            Err(LayoutError::LayerOutOfRange {
                layer: 3,
                num_layers: 3
            })
        );
        assert!(layout.offset(num_blocks - 1, 2).is_ok());
    }
}

#[test]
fn a_layout_without_blocks_has_no_addresses() {
    let layout = FullyContiguous::new(config(), 0, region(0, 0)).unwrap();
    assert_eq!(layout.total_bytes(), 0);
    assert_eq!(
        layout.offset(0, 0),
        Err(LayoutError::BlockOutOfRange {
            block: 0,
            num_blocks: 0
        })
    );
}

#[test]
fn any_layout_reports_what_the_wrapped_layout_does() {
    let inner = layer_separate();
    let any = AnyLayout::from(inner.clone());
    assert_eq!(any.config(), inner.config());
    assert_eq!(any.memory_type(), MemoryType::Pinned);
    assert_eq!(any.device_id(), 0);
    assert_eq!(any.total_bytes(), inner.total_bytes());
    assert_eq!(any.offset(1, 1), inner.offset(1, 1));
    assert_eq!(any.descriptor(), inner.descriptor());
    assert_eq!(inner.regions(), three_layer_regions().as_slice());
    assert_eq!(fully_contiguous().region(), &region(0x1000, 1280));
}

#[test]
fn serialised_descriptor_follows_the_documented_format() {
    let layout = FullyContiguous::new(
        config(),
        5,
        Region {
            device_id: 7,
            ..region(0x1000, 1280)
        },
    )
    .unwrap();
    let bytes = layout.descriptor().serialize();
    let mut expected = b"KVLY".to_vec();
    expected.extend_from_slice(&1u16.to_le_bytes());
    expected.extend_from_slice(&[0, 1, 1, 0]);
    for value in [7u32, 3, 4, 10, 64] {
        expected.extend_from_slice(&value.to_le_bytes());
    }
    for value in [5u64, 256, 80, 0x1000, 1280] {
        expected.extend_from_slice(&value.to_le_bytes());
    }
    assert_eq!(bytes, expected);
    assert_eq!(bytes.len(), 70);
    let separate = layer_separate().descriptor().serialize();
    assert_eq!(separate.len(), 46 + 3 * 16);
    assert_eq!(separate[6], 1);
    assert_eq!(&separate[46..54], &0x10000u64.to_le_bytes());
    assert_eq!(&separate[62..70], &0x40000u64.to_le_bytes());
}

#[test]
fn descriptors_round_trip_and_rebuild_the_same_layout() {
    let contiguous = fully_contiguous();
    let decoded = LayoutDescriptor::deserialize(&contiguous.descriptor().serialize()).unwrap();
    assert_eq!(decoded, contiguous.descriptor());
    assert_eq!(
        FullyContiguous::try_from(decoded.clone()),
        Ok(contiguous.clone())
    );
    assert_eq!(decoded.into_layout(), Ok(AnyLayout::from(contiguous)));

    let separate = layer_separate();
    let decoded = LayoutDescriptor::deserialize(&separate.descriptor().serialize()).unwrap();
    assert_eq!(decoded, separate.descriptor());
    assert_eq!(
        AnyLayout::try_from(decoded.clone()),
        Ok(AnyLayout::from(separate.clone()))
    );
    assert_eq!(LayerSeparate::try_from(decoded), Ok(separate));
}

#[test]
fn converting_a_descriptor_to_the_other_layout_kind_is_an_error() {
    assert_eq!(
        LayerSeparate::try_from(fully_contiguous().descriptor()),
        Err(LayoutError::WrongKind {
            expected: LayoutKind::LayerSeparate,
            got: LayoutKind::FullyContiguous
        })
    );
    assert_eq!(
        FullyContiguous::try_from(layer_separate().descriptor()),
        Err(LayoutError::WrongKind {
            expected: LayoutKind::FullyContiguous,
            got: LayoutKind::LayerSeparate
        })
    );
}

#[test]
fn into_layout_rechecks_hand_built_descriptors() {
    let mut two_regions = fully_contiguous().descriptor();
    two_regions.regions.push(Address {
        addr: 0x8000,
        len: 1280,
    });
    assert_eq!(
        two_regions.into_layout(),
        Err(LayoutError::RegionCount {
            expected: 1,
            got: 2
        })
    );
    let mut with_layer_stride = layer_separate().descriptor();
    with_layer_stride.layer_stride_bytes = Some(80);
    assert_eq!(
        with_layer_stride.into_layout(),
        Err(LayoutError::LayerStrideMismatch {
            expected: None,
            got: Some(80)
        })
    );
    let mut too_many_blocks = fully_contiguous().descriptor();
    too_many_blocks.num_blocks = u64::MAX;
    assert!(too_many_blocks.into_layout().is_err());
}

#[test]
fn decoding_reports_each_malformation_by_kind() {
    let good = fully_contiguous().descriptor().serialize();
    let with = |at: usize, value: &[u8]| {
        let mut bytes = good.clone();
        put(&mut bytes, at, value);
        LayoutDescriptor::deserialize(&bytes)
    };
    use LayoutDecodeError as E;
    assert_eq!(
        LayoutDescriptor::deserialize(&[]),
        Err(E::Truncated { needed: 4, got: 0 })
    );
    assert_eq!(
        LayoutDescriptor::deserialize(&good[..50]),
        Err(E::Truncated {
            needed: 54,
            got: 50
        })
    );
    assert_eq!(with(0, b"KVLZ"), Err(E::BadMagic(*b"KVLZ")));
    assert_eq!(with(4, &2u16.to_le_bytes()), Err(E::UnsupportedVersion(2)));
    assert_eq!(with(6, &[7]), Err(E::UnknownKind(7)));
    assert_eq!(with(7, &[99]), Err(E::UnknownDType(99)));
    assert_eq!(with(8, &[9]), Err(E::UnknownMemoryType(9)));
    assert_eq!(with(9, &[1]), Err(E::NonZeroReserved(1)));
    let mut long = good.clone();
    long.extend_from_slice(&[0, 0]);
    assert_eq!(
        LayoutDescriptor::deserialize(&long),
        Err(E::TrailingBytes(2))
    );
    // A layer-separate descriptor of 3 layers needs 3 regions, not 1 region and a stride.
    assert_eq!(
        with(6, &[1]),
        Err(E::Truncated {
            needed: 94,
            got: 70
        })
    );
}

#[test]
fn decoding_rejects_fields_that_contradict_the_config() {
    let good = fully_contiguous().descriptor().serialize();
    let with = |at: usize, value: &[u8]| {
        let mut bytes = good.clone();
        put(&mut bytes, at, value);
        LayoutDescriptor::deserialize(&bytes)
    };
    use LayoutDecodeError::Invalid;
    assert_eq!(
        with(38, &512u64.to_le_bytes()),
        Err(Invalid(LayoutError::BlockStrideMismatch {
            expected: 256,
            got: 512
        }))
    );
    assert_eq!(
        with(46, &96u64.to_le_bytes()),
        Err(Invalid(LayoutError::LayerStrideMismatch {
            expected: Some(80),
            got: Some(96)
        }))
    );
    assert_eq!(
        with(18, &0u32.to_le_bytes()),
        Err(Invalid(LayoutError::Zero { field: "page_size" }))
    );
    assert_eq!(
        with(26, &48u32.to_le_bytes()),
        Err(Invalid(LayoutError::AlignmentNotPowerOfTwo(48)))
    );
    assert_eq!(
        with(54, &0x1008u64.to_le_bytes()),
        Err(Invalid(LayoutError::MisalignedBase {
            region: 0,
            base_addr: 0x1008,
            alignment: 64
        }))
    );
    assert_eq!(
        with(62, &1024u64.to_le_bytes()),
        Err(Invalid(LayoutError::RegionTooSmall {
            region: 0,
            needed: 1280,
            len: 1024
        }))
    );
}

#[test]
fn a_huge_layer_count_with_a_short_input_is_refused_before_allocating() {
    let mut bytes = layer_separate().descriptor().serialize();
    put(&mut bytes, 14, &u32::MAX.to_le_bytes());
    assert_eq!(
        LayoutDescriptor::deserialize(&bytes),
        Err(LayoutDecodeError::Truncated {
            needed: 46 + 16 * u64::from(u32::MAX),
            got: 94
        })
    );
}

fn arb_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Fp8E4M3,
        DType::I8,
    ])
}

fn arb_memory_type() -> impl Strategy<Value = MemoryType> {
    prop::sample::select(vec![
        MemoryType::Device,
        MemoryType::Pinned,
        MemoryType::System,
        MemoryType::Disk,
    ])
}

fn arb_config() -> impl Strategy<Value = LayoutConfig> {
    (1u32..6, 1u32..33, 1u32..64, arb_dtype(), 0u32..12).prop_map(
        |(num_layers, page_size, inner_dim, dtype, shift)| LayoutConfig {
            num_layers,
            page_size,
            inner_dim,
            dtype,
            alignment: 1 << shift,
        },
    )
}

/// A valid layout with regions at unrelated aligned bases, with slack after them and,
/// for layer separate, in shuffled address order.
fn arb_layout() -> impl Strategy<Value = AnyLayout> {
    (
        arb_config(),
        0usize..10,
        any::<bool>(),
        arb_memory_type(),
        any::<u32>(),
    )
        .prop_flat_map(|(config, num_blocks, separate, memory_type, device_id)| {
            let layers = config.num_layers as usize;
            (
                Just((config, num_blocks, separate, memory_type, device_id)),
                prop::collection::vec((0u64..4, 0u64..300), layers),
                Just((0..layers).collect::<Vec<_>>()).prop_shuffle(),
            )
        })
        .prop_map(
            |((config, num_blocks, separate, memory_type, device_id), slots, order)| {
                let alignment = u64::from(config.alignment);
                let needed = if separate {
                    LayerSeparate::required_bytes_per_region(&config, num_blocks).unwrap()
                } else {
                    FullyContiguous::required_bytes(&config, num_blocks).unwrap()
                };
                let mut cursor = 1u64 << 40;
                let mut placed = Vec::new();
                for (gap, slack) in slots {
                    let base =
                        align_up(cursor, config.alignment, "test").unwrap() + gap * alignment;
                    placed.push(Region {
                        memory_type,
                        device_id,
                        base_addr: base,
                        len: needed + slack,
                    });
                    cursor = base + needed + slack;
                }
                if separate {
                    let regions = order.iter().map(|&slot| placed[slot]).collect();
                    AnyLayout::from(LayerSeparate::new(config, num_blocks, regions).unwrap())
                } else {
                    AnyLayout::from(FullyContiguous::new(config, num_blocks, placed[0]).unwrap())
                }
            },
        )
}

proptest! {
    #[test]
    fn deserialising_arbitrary_bytes_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let _ = LayoutDescriptor::deserialize(&bytes);
    }

    #[test]
    fn deserialising_garbage_after_a_valid_prefix_never_panics(
        kind in 0u8..2,
        rest in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut bytes = b"KVLY".to_vec();
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.push(kind);
        bytes.extend_from_slice(&rest);
        let _ = LayoutDescriptor::deserialize(&bytes);
    }

    #[test]
    fn a_mutated_descriptor_is_rejected_or_round_trips(
        layout in arb_layout(),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let mut bytes = layout.descriptor().serialize();
        let at = at.index(bytes.len());
        bytes[at] = value;
        if let Ok(decoded) = LayoutDescriptor::deserialize(&bytes) {
            prop_assert_eq!(decoded.serialize(), bytes);
            prop_assert!(decoded.into_layout().is_ok());
        }
    }

    #[test]
    fn valid_descriptors_round_trip_exactly(layout in arb_layout()) {
        let descriptor = layout.descriptor();
        let decoded = LayoutDescriptor::deserialize(&descriptor.serialize());
        prop_assert_eq!(decoded.as_ref(), Ok(&descriptor));
        prop_assert_eq!(descriptor.into_layout(), Ok(layout));
    }

    #[test]
    fn every_truncation_of_a_valid_descriptor_is_rejected(layout in arb_layout()) {
        let bytes = layout.descriptor().serialize();
        for len in 0..bytes.len() {
            let truncated = LayoutDescriptor::deserialize(&bytes[..len]);
            prop_assert!(
                matches!(truncated, Err(LayoutDecodeError::Truncated { .. })),
                "{} of {} bytes gave {:?}", len, bytes.len(), truncated
            );
        }
    }

    #[test]
    fn offsets_never_overlap_and_stay_inside_their_regions(layout in arb_layout()) {
        let alignment = u64::from(layout.config().alignment);
        let layer_bytes = layout.config().layer_bytes().unwrap();
        let mut spans = Vec::new();
        for block in 0..layout.num_blocks() {
            for layer in 0..layout.config().num_layers as usize {
                let address = layout.offset(block, layer).unwrap();
                let region = match &layout {
                    AnyLayout::FullyContiguous(inner) => *inner.region(),
                    AnyLayout::LayerSeparate(inner) => inner.regions()[layer],
                };
                prop_assert_eq!(address.len, layer_bytes);
                prop_assert!(address.addr >= region.base_addr);
                prop_assert!(address.addr + address.len <= region.base_addr + region.len);
                if layer == 0 || layout.layer_stride_bytes().is_none() {
                    prop_assert_eq!(address.addr % alignment, 0);
                }
                spans.push((address.addr, address.addr + address.len));
            }
        }
        let total: u64 = spans.iter().map(|(start, end)| end - start).sum();
        prop_assert!(total <= layout.total_bytes());
        spans.sort_unstable();
        for pair in spans.windows(2) {
            prop_assert!(pair[0].1 <= pair[1].0, "{:?} overlaps {:?}", pair[0], pair[1]);
        }
    }
}
