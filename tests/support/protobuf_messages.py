"""Protobuf message classes for tests, built from descriptors at run time (no protoc needed).

`order_class(version)`: `shop.Order`, version 2 adding the optional field `coupon`; each version
lives in a pool of its own, as two builds of a producer would.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool, message_factory, text_format, timestamp_pb2
from google.protobuf.descriptor_pb2 import FileDescriptorProto

ORDER_V1 = """
name: "shop/order.proto" package: "shop" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto"
message_type {
  name: "Order"
  field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "name" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "amount" number: 3 type: TYPE_DOUBLE label: LABEL_OPTIONAL }
  field { name: "status" number: 4 type: TYPE_ENUM type_name: ".shop.Order.Status" label: LABEL_OPTIONAL }
  field { name: "created" number: 5 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp"
          label: LABEL_OPTIONAL }
  field { name: "tags" number: 6 type: TYPE_STRING label: LABEL_REPEATED }
  field { name: "attrs" number: 7 type: TYPE_MESSAGE type_name: ".shop.Order.AttrsEntry" label: LABEL_REPEATED }
  field { name: "customer" number: 8 type: TYPE_MESSAGE type_name: ".shop.Order.Customer" label: LABEL_OPTIONAL }
  field { name: "note" number: 9 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 proto3_optional: true }
  field { name: "big" number: 10 type: TYPE_UINT64 label: LABEL_OPTIONAL }
  %s
  nested_type { name: "Customer"
    field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "vip" number: 2 type: TYPE_BOOL label: LABEL_OPTIONAL } }
  nested_type { name: "AttrsEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL } }
  enum_type { name: "Status" value { name: "NEW" number: 0 } value { name: "PAID" number: 1 } }
  oneof_decl { name: "_note" }
  %s
}
"""
COUPON_FIELD = ('field { name: "coupon" number: 11 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 1 '
                'proto3_optional: true }')
COUPON_ONEOF = 'oneof_decl { name: "_coupon" }'


def order_class(version: int) -> type:
    text = ORDER_V1 % ((COUPON_FIELD, COUPON_ONEOF) if version == 2 else ("", ""))
    proto = text_format.Parse(text, FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    timestamp = FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    pool.Add(timestamp)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def key_class() -> type:
    """`shop.OrderKey`: one field, `id`."""
    text = ('name: "shop/key.proto" package: "shop" syntax: "proto3" message_type { name: "OrderKey" '
            'field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL } }')
    proto = text_format.Parse(text, FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.OrderKey"))


def referencing_class() -> type:
    """`shop.Invoice`, whose `customer` is `shop.Party` imported from another file (a schema reference)."""
    party = text_format.Parse(
        'name: "shop/party.proto" package: "shop" syntax: "proto3" message_type { name: "Party" '
        'field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL } }', FileDescriptorProto())
    invoice = text_format.Parse(
        'name: "shop/invoice.proto" package: "shop" syntax: "proto3" dependency: "shop/party.proto" '
        'message_type { name: "Header" field { name: "x" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL } } '
        'message_type { name: "Invoice" field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL } '
        'field { name: "customer" number: 2 type: TYPE_MESSAGE type_name: ".shop.Party" label: LABEL_OPTIONAL } '
        'nested_type { name: "Line" field { name: "sku" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL } } }',
        FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(party)
    pool.Add(invoice)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Invoice"))
