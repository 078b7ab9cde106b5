from inventory import store


def test_stock_is_counted_by_sku():
    # The repair: stock is looked up by SKU, which needs the new schema (a sku column)
    # and the code that uses it.
    assert store.stock_by_sku("BOLT-M6") == 3
