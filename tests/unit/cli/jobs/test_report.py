from paramshard.observe.report.server_table import server_load_table

STATS = [{"server": 0, "address": "127.0.0.1:45123", "dense_elements": 123456, "sparse_rows": 12345678,
          "sparse_bytes": 2**30, "bytes_in": 2**33, "bytes_out": 2**33, "requests": 1234567, "errors": 0},
         {"server": 1, "address": "10.213.7.12:45123", "dense_elements": 120000, "sparse_rows": 1234,
          "bytes_in": 5, "requests": 2, "errors": 3}]


def test_the_load_table_fits_an_80_column_terminal_behind_the_launchers_prefix():
    table = server_load_table(STATS)
    assert max(len("trainer 0 | " + line) for line in table.splitlines()) <= 80
    assert "12,345,678" in table and "51%" in table and "1234567" in table
    assert "dense load max/mean = 1.014" in table and "1=10.213.7.12:45123" in table
