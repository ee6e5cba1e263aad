"""One list of common English words, shared by the load generator and the tiny test model.

The load generator (:mod:`autotune.execution.loadgen`) builds OpenAI prompts from these words: most BPE
tokenizers encode each of them, with its leading space, as one token, so a prompt of ``n`` words
is about ``n`` tokens. The tiny test model (:mod:`autotune.testing.tiny_model`) gives each of them
one token of its word-level vocabulary, so every word the load generator sends is a known token.
"""

from __future__ import annotations

__all__ = ["COMMON_WORDS"]

#: Distinct lowercase words, in a fixed order (the tiny model's token ids follow it).
COMMON_WORDS: tuple[str, ...] = tuple(
    """the of and to in is was for on are with as at be by this had not but from have they which one
    you were her all she there would their we him been has when who will more no if out so said what
    up its about into than them can only other new some could time these two may then do first any
    my now such like our over man me even most made after also did many before must through back
    years where much your way well down should because each just those people how too little state
    good very make world still own see men work long get here between both life being under never
    day same another know while last might us great old year off come since against go came right
    used take three house water small place end put home read hand large add land big high follow
    act why ask change went light kind need try again animal point mother near build self earth
    father head stand page country found answer school grow study learn plant cover food sun four
    thought let keep eye tree city cross hard start story saw far sea draw left late run press close
    night real north open seem together next white children begin walk example paper group always
    music mark often letter until mile river car feet care second book carry took science eat room
    friend began idea fish mountain stop once base hear horse cut sure watch color face wood main
    enough plain girl usual young ready above ever red list though feel talk bird soon body dog
    family direct pose leave song measure door product black short class wind question happen
    complete ship area half rock order fire south problem piece told knew pass farm top whole king
    size heard best hour better true during hundred five remember step early hold west ground
    interest reach fast sing listen six table travel less morning ten simple several toward war lay
    pattern slow center love person money serve appear road map rain rule govern pull cold notice
    voice unit power town fine drive""".split()
)
