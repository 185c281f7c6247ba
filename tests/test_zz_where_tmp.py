def test_where():
    import autoparallel
    print("AP", autoparallel.__file__)
